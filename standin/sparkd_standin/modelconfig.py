"""What vLLM's ModelConfig logs (and refuses) while the engine config is built, on the head and headless."""

from __future__ import annotations

import os

from sparkd_standin import logfmt, sizing
from sparkd_standin.args import ServeConfig
from sparkd_standin.dialect import Dialect

_FRAMES = [
    ("entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
    ("engine/arg_utils.py", 1386, "create_engine_config", "model_config = self.create_model_config()"),
    ("engine/arg_utils.py", 1240, "create_model_config", "return ModelConfig("),
    ("/usr/local/lib/python3.12/dist-packages/pydantic/_internal/_dataclasses.py", 121, "__init__",
     "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"),
]  # fmt: skip
_CAUTION = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position "
    "encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position "
    "encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
)


def _allow_long() -> bool:
    return os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true")


def create_model_config(config: ServeConfig, d: Dialect) -> bool:
    """Log the model lines; False after printing the ValidationError when --max-model-len is too long."""
    logfmt.info(d.at("arch"), f"Resolved architecture: {sizing.architecture(config.model)}")
    wanted, derived = config.max_model_len or 0, config.derived_max_model_len
    if wanted > derived:
        message = (
            f"User-specified max_model_len ({wanted}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json)."
        )
        if not _allow_long():
            logfmt.print_stderr(
                logfmt.traceback_text(
                    _FRAMES, "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
                )
                + f"\n  Value error, {message} To allow overriding this maximum, set the env var "
                f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. {_CAUTION} [type=value_error, "
                f"input_value=ArgsKwargs((), {{'model': '{config.model}', ...}}), input_type=ArgsKwargs]\n"
                "    For further information visit https://errors.pydantic.dev/2.12/v/value_error"
            )
            return False
        logfmt.warning(d.at("long_len"), f"{message} {_CAUTION}")
    logfmt.info(d.at("max_len"), f"Using max model len {config.resolved_max_model_len}")
    return True
