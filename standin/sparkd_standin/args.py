"""``vllm`` / ``vllm serve`` argument parsing, after vLLM's FlexibleArgumentParser.

- The command line is ``vllm SUBCOMMAND ...``: a top-level parser (``-h``, ``-v``) with vLLM's subcommands; only
  ``serve`` runs. argparse itself reports errors, as in vLLM: an unknown flag is the top-level parser's
  ``vllm: error: unrecognized arguments: ...`` (exit 2), a bad value the serve parser's ``vllm serve: error:``.
- ``--flag_name`` is ``--flag-name`` (only the part before ``=`` or the first ``.`` is rewritten); ``-O3``,
  ``-O 3`` and ``-O=3`` are ``--optimization-level 3``.
- ``--json-flag.key.sub VALUE`` becomes ``--json-flag '{"key": {"sub": VALUE}}'`` appended at the end (dotted keys
  of one flag merge; an explicit ``--json-flag`` before them is overridden, as in vLLM).
- The flags are those of the imitated release (``flags.serve_flags``); ``--standin-<knob> VALUE`` flags are the
  stand-in's own, hidden from help and kept out of ``non-default args``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd_standin.flags import Flag, serve_flags
from sparkd_standin.knobs import KNOB_NAMES, flag_name

USAGE = "vllm serve [model_tag] [options]"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
_KNOB_DEST = "standin_"
SUBCOMMANDS = {
    "0.13": ("chat", "complete", "serve", "bench", "collect-env", "run-batch"),
    "0.21": ("chat", "complete", "serve", "launch", "bench", "collect-env", "run-batch"),
    "0.24": ("chat", "complete", "serve", "launch", "bench", "collect-env", "run-batch"),
    "0.32": ("chat", "complete", "serve", "launch", "bench", "collect-env", "download-kernels", "preload", "run-batch",
             "snapshot"),
}
EPILOG = (
    "For full list:            vllm {subcmd} --help=all\n"
    "For a section:            vllm {subcmd} --help=ModelConfig    (case-insensitive)\n"
    "For a flag:               vllm {subcmd} --help=max-model-len  (_ or - accepted)\n"
    "Documentation:            https://docs.vllm.ai\n"
)

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """``25600``, ``1k`` (1000), ``1K`` (1024), ``1m``, ``1M``; ``-1``/``auto`` mean "derive it"."""
    value = value.strip()
    if value.lower() == "auto":
        return -1
    match = _HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        try:
            return int(number) * _BINARY[suffix]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from exc
    return int(value)


def json_object(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Value {value} cannot be converted to {json.loads}.") from exc


def _add_flag(parser: argparse.ArgumentParser, flag: Flag) -> None:
    kwargs: dict[str, Any] = {"default": flag.default}
    if flag.kind == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    elif flag.kind == "true":
        kwargs.update(action="store_true", default=False)
    elif flag.kind == "list":
        kwargs["nargs"] = "+"
    else:
        types = {"int": int, "float": float, "hint": human_readable_int, "str": str, "json": json_object}
        kwargs["type"] = types[flag.kind]
    parser.add_argument(*flag.names, **kwargs)


def build_parser(family: str, version: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """vLLM's ``vllm`` parser for release ``family`` and its ``serve`` subparser."""
    top = argparse.ArgumentParser(
        prog="vllm", description="vLLM CLI", epilog=EPILOG.format(subcmd="[subcommand]"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    top.add_argument("-v", "--version", action="version", version=version)
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = None
    for name in SUBCOMMANDS[family]:
        if name != "serve":
            subparsers.add_parser(name, add_help=False)
            continue
        serve = subparsers.add_parser(
            name, usage=USAGE, epilog=EPILOG.format(subcmd=name), allow_abbrev=False,
            help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
            description="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        serve.add_argument("model_tag", nargs="?", default=None)
        for flag in serve_flags(family):
            _add_flag(serve, flag)
        for knob in KNOB_NAMES:
            serve.add_argument(
                flag_name(knob), dest=_KNOB_DEST + knob, nargs="?", const="1", default=None, help=argparse.SUPPRESS
            )
    assert serve is not None
    return top, serve


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _optimization_level(argv: Sequence[str], index: int) -> tuple[list[str], int]:
    """``-O3``/``-O=3``/``-O 3`` as ``--optimization-level 3``: (the rewritten words, words consumed)."""
    arg = argv[index]
    if arg != "-O":
        return ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]], 1
    if index + 1 < len(argv) and argv[index + 1] in ("0", "1", "2", "3"):
        return ["--optimization-level"], 1
    return [arg], 1


def preprocess(argv: Sequence[str]) -> list[str]:
    """FlexibleArgumentParser's rewriting: dashes for underscores, ``-O``, dotted JSON keys appended as JSON."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--") and len(arg) > 2:
            key, eq, text = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            head = "--" + head.replace("_", "-")
            if dot:
                if not eq and index + 1 < len(argv):
                    index += 1
                    text = argv[index]
                _merge(dotted.setdefault(head, {}), tail.split("."), _json_or_str(text))
            else:
                out.append(head + eq + text)
        elif arg.startswith("-O"):
            words, used = _optimization_level(argv, index)
            out.extend(words)
            index += used - 1
        else:
            out.append(arg)
        index += 1
    for flag, merged in dotted.items():
        out += [flag, json.dumps(merged)]
    return out


def _merge(target: dict[str, Any], keys: list[str], value: Any) -> None:
    *parents, leaf = keys
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value


@dataclass(frozen=True)
class ServeConfig:
    """The parsed ``vllm serve`` arguments the stand-in acts on, with vLLM's defaults applied."""

    model: str
    served_model_names: tuple[str, ...]
    host: str | None = None
    port: int = 8000
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enable_expert_parallel: bool = False
    api_keys: tuple[str, ...] = ()
    disable_log_stats: bool = False
    disable_uvicorn_access_log: bool = False
    uvicorn_log_level: str = "info"
    shutdown_timeout: int = 0  # --shutdown-timeout (0.21+): how long SIGTERM drains the requests in flight
    swap_space: float = 4.0
    dtype: str = "auto"
    quantization: str | None = None
    tokenizer: str | None = None
    tokenizer_mode: str = "auto"
    load_format: str = "auto"
    trust_remote_code: bool = False
    seed: int = 0
    compilation_config: dict[str, Any] = field(default_factory=dict)
    speculative_config: dict[str, Any] | None = None
    non_default: dict[str, Any] = field(default_factory=dict)
    derived_max_model_len: int = 1048576  # from the model's config.json (the max_position_embeddings knob)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        return max(1, self.world_size // max(1, self.nnodes))

    @property
    def resolved_max_model_len(self) -> int:
        if self.max_model_len is None or self.max_model_len <= 0:
            return self.derived_max_model_len
        return self.max_model_len


def _pick(ns: argparse.Namespace, name: str, default: Any = None) -> Any:
    """The flag's value, or ``default`` when it is unset or the imitated release has no such flag."""
    value = getattr(ns, name, None)
    return default if value is None else value


def _compilation_config(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return {} if value is None else {"level": value}  # ``--compilation-config 3``: the old spelling of a level


def _config_from(ns: argparse.Namespace, non_default: dict[str, Any], env: Mapping[str, str]) -> ServeConfig:
    model = ns.model_tag or _pick(ns, "model") or DEFAULT_MODEL
    api_keys = tuple(_pick(ns, "api_key") or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else []))
    return ServeConfig(
        model=model,
        served_model_names=tuple(_pick(ns, "served_model_name") or [model]),
        host=_pick(ns, "host"),
        port=ns.port,
        tensor_parallel_size=_pick(ns, "tensor_parallel_size", 1),
        pipeline_parallel_size=_pick(ns, "pipeline_parallel_size", 1),
        nnodes=_pick(ns, "nnodes", 1),
        node_rank=_pick(ns, "node_rank", 0),
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=ns.headless,
        max_model_len=_pick(ns, "max_model_len"),
        max_num_seqs=_pick(ns, "max_num_seqs", 256),
        max_num_batched_tokens=_pick(ns, "max_num_batched_tokens", 8192),
        block_size=_pick(ns, "block_size", 16),
        gpu_memory_utilization=_pick(ns, "gpu_memory_utilization", 0.9),
        kv_cache_dtype=_pick(ns, "kv_cache_dtype", "auto"),
        kv_cache_memory_bytes=_pick(ns, "kv_cache_memory_bytes"),
        enforce_eager=bool(_pick(ns, "enforce_eager")),
        enable_prefix_caching=_pick(ns, "enable_prefix_caching", True),
        enable_chunked_prefill=_pick(ns, "enable_chunked_prefill", True),
        enable_expert_parallel=bool(_pick(ns, "enable_expert_parallel")),
        api_keys=api_keys,
        disable_log_stats=bool(_pick(ns, "disable_log_stats")),
        disable_uvicorn_access_log=bool(_pick(ns, "disable_uvicorn_access_log")),
        uvicorn_log_level=_pick(ns, "uvicorn_log_level", "info"),
        shutdown_timeout=_pick(ns, "shutdown_timeout", 0),
        swap_space=_pick(ns, "swap_space", 4.0),
        dtype=_pick(ns, "dtype", "auto"),
        quantization=_pick(ns, "quantization"),
        tokenizer=_pick(ns, "tokenizer"),
        tokenizer_mode=_pick(ns, "tokenizer_mode", "auto"),
        load_format=_pick(ns, "load_format", "auto"),
        trust_remote_code=bool(_pick(ns, "trust_remote_code")),
        seed=_pick(ns, "seed", 0),
        compilation_config=_compilation_config(_pick(ns, "compilation_config")),
        speculative_config=_pick(ns, "speculative_config"),
        non_default=non_default,
    )


def requested_family(argv: Sequence[str], env: Mapping[str, str], default: str) -> tuple[str, str]:
    """(family, version) asked for by ``--standin-vllm-version`` (before parsing: the flags depend on it) or
    SPARKD_STANDIN_VLLM_VERSION; an unknown version falls back to ``default`` here and is refused by the knob."""
    version = env.get("SPARKD_STANDIN_VLLM_VERSION") or default
    for index, arg in enumerate(argv):
        if arg.startswith("--standin-vllm-version=") or arg.startswith("--standin_vllm_version="):
            version = arg.partition("=")[2]
        elif arg in ("--standin-vllm-version", "--standin_vllm_version") and index + 1 < len(argv):
            version = argv[index + 1]
    family = ".".join(version.split(".")[:2])
    if family not in SUBCOMMANDS:
        version = default
    return ".".join(version.split(".")[:2]), version


@dataclass(frozen=True)
class Command:
    """A parsed ``vllm`` command line: the subcommand, and for ``serve`` its config and ``--standin-*`` values."""

    subcommand: str | None
    config: ServeConfig | None = None
    knob_flags: dict[str, str | None] = field(default_factory=dict)


def parse_command(argv: Sequence[str], family: str, version: str, env: Mapping[str, str] | None = None) -> Command:
    """Parse a whole ``vllm`` command line (``serve MODEL --flags``) as release ``family`` does.

    Raises SystemExit after argparse printed the usage error (status 2), the help or the version (status 0).
    """
    top, serve = build_parser(family, version)
    ns = top.parse_args(preprocess(argv))
    if ns.subparser != "serve":
        if ns.subparser is None:
            top.print_help()
        return Command(ns.subparser)
    defaults = vars(serve.parse_args([]))
    knob_flags = {knob: getattr(ns, _KNOB_DEST + knob) for knob in KNOB_NAMES}
    non_default = {
        name: value
        for name, value in vars(ns).items()
        if name in defaults and not name.startswith(_KNOB_DEST) and value != defaults[name]
    }
    if ns.model_tag and not _pick(ns, "model"):
        non_default["model"] = ns.model_tag  # vLLM's serve sets args.model from the positional
    config = _config_from(ns, non_default, os.environ if env is None else env)
    return Command("serve", config, knob_flags)


def parse_serve_args(
    argv: Sequence[str], env: Mapping[str, str] | None = None, family: str = "0.21", version: str = "0.21.0"
) -> tuple[ServeConfig, dict[str, str | None]]:
    """The arguments after ``serve``: the config and the ``--standin-*`` values by knob name."""
    command = parse_command(["serve", *argv], family, version, env)
    assert command.config is not None
    return command.config, command.knob_flags
