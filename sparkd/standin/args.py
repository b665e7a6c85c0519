"""``vllm serve`` argument parsing, after vLLM's FlexibleArgumentParser.

- ``--flag_name`` is the same as ``--flag-name`` (only the part before ``=`` or the first ``.`` is rewritten).
- ``--json-flag.key.sub VALUE`` merges ``{"key": {"sub": VALUE}}`` into the JSON flag; ``-O3`` is ``-O 3``.
- Unknown flags end with argparse's usage line and ``vllm serve: error: unrecognized arguments: ...``, exit 2.
- ``--standin-<knob> VALUE`` flags are the stand-in's own; they are kept out of ``non-default args``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd.standin.flags import SERVE_FLAGS, Flag
from sparkd.standin.knobs import KNOB_NAMES, flag_name

PROG = "vllm serve"
USAGE = "vllm serve [model_tag] [options]"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
_KNOB_DEST = "standin_"

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


def compilation_config(value: str) -> Any:
    """``-O3`` / ``--compilation-config 3`` is the optimisation level; anything else is JSON."""
    return {"level": int(value)} if value.isdigit() else json_object(value)


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
        kwargs["type"] = compilation_config if flag.names[0] == "--compilation-config" else types[flag.kind]
    parser.add_argument(*flag.names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, usage=USAGE, allow_abbrev=False)
    parser.add_argument("model_tag", nargs="?", default=None)
    for flag in SERVE_FLAGS:
        _add_flag(parser, flag)
    for knob in KNOB_NAMES:
        parser.add_argument(
            flag_name(knob), dest=_KNOB_DEST + knob, nargs="?", const="1", default=None, help=argparse.SUPPRESS
        )
    return parser


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def preprocess(argv: Sequence[str]) -> tuple[list[str], dict[str, list[tuple[str, Any]]]]:
    """Normalise flag spellings; pull out dotted JSON keys as {"--flag": [(dotted.key, value), ...]}."""
    out: list[str] = []
    dotted: dict[str, list[tuple[str, Any]]] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            head = "--" + head.replace("_", "-")
            if dot:
                if not eq and index + 1 < len(argv):
                    index += 1
                    value = argv[index]
                dotted.setdefault(head, []).append((tail, _json_or_str(value)))
            else:
                out.append(head + eq + value)
        elif re.fullmatch(r"-O\d+", arg):
            out.extend(["-O", arg[2:]])
        else:
            out.append(arg)
        index += 1
    return out, dotted


def _merge_dotted(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, dotted: Mapping[str, list[tuple[str, Any]]]
) -> None:
    json_dests = {f.names[0]: f.names[0][2:].replace("-", "_") for f in SERVE_FLAGS if f.kind == "json"}
    for flag, items in dotted.items():
        if flag not in json_dests:
            parser.error("unrecognized arguments: " + " ".join(f"{flag}.{key}" for key, _ in items))
        target = getattr(ns, json_dests[flag]) or {}
        for key, value in items:
            node = target
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        setattr(ns, json_dests[flag], target)


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


def _pick(ns: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(ns, name)
    return default if value is None else value


def _config_from(ns: argparse.Namespace, non_default: dict[str, Any], env: Mapping[str, str]) -> ServeConfig:
    model = ns.model_tag or ns.model or DEFAULT_MODEL
    api_keys = tuple(ns.api_key or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else []))
    return ServeConfig(
        model=model,
        served_model_names=tuple(ns.served_model_name or [model]),
        host=ns.host,
        port=ns.port,
        tensor_parallel_size=_pick(ns, "tensor_parallel_size", 1),
        pipeline_parallel_size=_pick(ns, "pipeline_parallel_size", 1),
        nnodes=_pick(ns, "nnodes", 1),
        node_rank=_pick(ns, "node_rank", 0),
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=ns.headless,
        max_model_len=ns.max_model_len,
        max_num_seqs=_pick(ns, "max_num_seqs", 256),
        max_num_batched_tokens=_pick(ns, "max_num_batched_tokens", 8192),
        block_size=_pick(ns, "block_size", 16),
        gpu_memory_utilization=_pick(ns, "gpu_memory_utilization", 0.9),
        kv_cache_dtype=_pick(ns, "kv_cache_dtype", "auto"),
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        enforce_eager=bool(ns.enforce_eager),
        enable_prefix_caching=_pick(ns, "enable_prefix_caching", True),
        enable_chunked_prefill=_pick(ns, "enable_chunked_prefill", True),
        enable_expert_parallel=bool(ns.enable_expert_parallel),
        api_keys=api_keys,
        disable_log_stats=ns.disable_log_stats,
        disable_uvicorn_access_log=bool(ns.disable_uvicorn_access_log),
        uvicorn_log_level=_pick(ns, "uvicorn_log_level", "info"),
        swap_space=_pick(ns, "swap_space", 4.0),
        dtype=_pick(ns, "dtype", "auto"),
        quantization=ns.quantization,
        tokenizer=ns.tokenizer,
        tokenizer_mode=_pick(ns, "tokenizer_mode", "auto"),
        load_format=_pick(ns, "load_format", "auto"),
        trust_remote_code=bool(ns.trust_remote_code),
        seed=_pick(ns, "seed", 0),
        compilation_config=ns.compilation_config or {},
        speculative_config=ns.speculative_config,
        non_default=non_default,
    )


def parse_serve_args(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[ServeConfig, dict[str, str | None]]:
    """Parse the arguments after ``serve``. Returns the config and the ``--standin-*`` values by knob name.

    Raises SystemExit(2) after printing argparse's usage error, as vLLM does.
    """
    parser = build_parser()
    args, dotted = preprocess(argv)
    ns = parser.parse_intermixed_args(args)
    _merge_dotted(parser, ns, dotted)
    defaults = vars(parser.parse_args([]))
    knob_flags = {knob: getattr(ns, _KNOB_DEST + knob) for knob in KNOB_NAMES}
    non_default = {
        name: value
        for name, value in vars(ns).items()
        if not name.startswith(_KNOB_DEST) and value != defaults.get(name)
    }
    if ns.model_tag and not ns.model:
        non_default["model"] = ns.model_tag
    return _config_from(ns, non_default, os.environ if env is None else env), knob_flags
