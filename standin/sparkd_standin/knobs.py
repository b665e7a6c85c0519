"""Fault and behaviour knobs of the stand-in.

Every knob is read from the environment variable ``SPARKD_STANDIN_<NAME>`` so that a rehearsal can keep the real
vLLM argv, and is also accepted as a ``--standin-<name> VALUE`` flag (the flag wins over the environment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sparkd_standin.answers import ANSWER_MODES
from sparkd_standin.dialect import Dialect, dialect

ENV_PREFIX = "SPARKD_STANDIN_"
FLAG_PREFIX = "--standin-"
DIE_MODES = ("exit", "engine", "kill", "worker")
PEER_LOSS_MODES = ("hang", "error")
# Crashes seen in the field, replayed while the model loads (field report 002):
#   fork_shm       VLLM_WORKER_MULTIPROC_METHOD=fork on GB10: AttributeError: 'ShmRingBuffer' ... 'shared_memory'
#   double_patch   a patch applied twice to mxfp4.py: UnboundLocalError ... 'w13'
#   missing_module a module the model needs is not in the image (MISSING_MODULE, default deep_gemm)
CRASHES = ("fork_shm", "double_patch", "missing_module")
# The vLLM release whose log lines, titles and flags the stand-in imitates, by minor version (see dialect).
VLLM_FAMILIES = ("0.13", "0.21", "0.24", "0.32")


class KnobError(ValueError):
    """A knob value that cannot be parsed; the message names the knob."""


@dataclass(frozen=True)
class Knobs:
    startup_seconds: float = 3.0  # total simulated load time, spread across the load phases
    shards: int = 4  # safetensors shards shown in the loading progress lines
    die_after: float | None = None  # seconds after ready; None = never
    die_mode: str = "exit"  # exit | engine | kill | worker
    die_exit_code: int = 1  # exit status for die_mode=exit
    hang_after: float | None = None  # seconds after ready: the API event loop stops answering
    stall_after: float | None = None  # seconds after ready: from then on no engine step completes (a wedged rank)
    leak_mb_per_s: float = 0.0  # worker allocates and touches this much memory per second once loaded
    leak_max_mb: float = 1024.0  # cap on the leak
    fail_free_memory: bool = False  # refuse to start with vLLM's free-memory error
    ignore_sigterm_while_loading: bool = False  # SIGTERM is ignored until ready
    orphan_on_kill: bool = False  # children survive their parent's death (stale VLLM::* litter)
    # vLLM's version: 0.13.x, 0.21.x or 0.24.x. Default 0.21.0: the field runs 0.21 (0.21.1rc1 and 0.21.1 images
    # in field reports 000 and 001; 002 a nightly of that line; only 004 mentions 0.24), and 0.21.0 is the newest
    # 0.21 release on PyPI, whose source the stand-in's lines were checked against.
    vllm_version: str = "0.21.0"
    time_scale: float = 1.0  # multiplies vLLM's own waits: the shm-broadcast warning interval, the RPC timeout
    peer_loss: str = "hang"  # a lost peer: the collective hangs until the RPC timeout | error: NCCL error at once
    crash: str | None = None  # one of CRASHES, raised while the model loads
    missing_module: str = "deep_gemm"  # the module crash=missing_module cannot import
    jit_after: float | None = None  # seconds after ready: the next engine step JIT-compiles a kernel first
    jit_seconds: float = 30.0  # how long that compilation pauses every step
    tokens_per_s: float = 200.0  # generation rate of each request
    tcpstore_timeout: float = 600.0  # seconds both rendezvous sides wait for each other
    max_position_embeddings: int = 1048576  # the model's derived max_model_len (its config.json)
    argv_file: str | None = None  # write json.dumps(sys.argv) here at start
    control_file: str | None = None  # stall, hang or leak a running rank by writing here (see control.py)
    answers: str = "normal"  # what the engine answers: normal | changed | garble | loop | empty (see answers.py)
    spec_decode_accepts: bool = True  # with --speculative-config: False, drafts are proposed and none accepted
    nan_logits: bool = False  # with VLLM_COMPUTE_NANS_IN_LOGITS=1: every request counts in vllm:corrupted_requests
    # idle threads each process keeps, as the thread pools torch, NCCL and CUDA start do in vLLM's processes (a GPU
    # host's vLLM runs hundreds of threads; a supervisor that walks the tree's tasks pays for each)
    idle_threads: int = 0

    @property
    def dialect(self) -> Dialect:
        return dialect(self.vllm_version)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


def _optional_float(text: str) -> float | None:
    return None if text.strip() == "" else float(text)


def _optional_str(text: str) -> str | None:
    return text or None


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(text)
        return text

    return parse


def _optional_one_of(*choices: str) -> Callable[[str], str | None]:
    def parse(text: str) -> str | None:
        return None if text in ("", "none") else _one_of(*choices)(text)

    return parse


def _vllm_version(text: str) -> str:
    if ".".join(text.strip().split(".")[:2]) not in VLLM_FAMILIES:
        raise ValueError(text)
    return text.strip()


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(text)
    return value


_PARSERS: dict[str, Callable[[str], object]] = {
    "startup_seconds": float,
    "shards": int,
    "die_after": _optional_float,
    "die_mode": _one_of(*DIE_MODES),
    "die_exit_code": int,
    "hang_after": _optional_float,
    "stall_after": _optional_float,
    "leak_mb_per_s": float,
    "leak_max_mb": float,
    "fail_free_memory": _bool,
    "ignore_sigterm_while_loading": _bool,
    "orphan_on_kill": _bool,
    "vllm_version": _vllm_version,
    "time_scale": _positive,
    "peer_loss": _one_of(*PEER_LOSS_MODES),
    "crash": _optional_one_of(*CRASHES),
    "missing_module": str,
    "jit_after": _optional_float,
    "jit_seconds": float,
    "tokens_per_s": float,
    "tcpstore_timeout": float,
    "max_position_embeddings": int,
    "argv_file": _optional_str,
    "idle_threads": _count,
    "control_file": _optional_str,
    "answers": _one_of(*ANSWER_MODES),
    "spec_decode_accepts": _bool,
    "nan_logits": _bool,
}

_EXPECTED = {
    "die_mode": f" (one of {', '.join(DIE_MODES)})",
    "peer_loss": f" (one of {', '.join(PEER_LOSS_MODES)})",
    "crash": f" (one of {', '.join(CRASHES)})",
    "answers": f" (one of {', '.join(ANSWER_MODES)})",
    "vllm_version": f" (a {', '.join(f'{f}.x' for f in VLLM_FAMILIES)} version)",
    "time_scale": " (a number > 0)",
}
KNOB_NAMES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Knobs))


def scaled(seconds: float, knobs: Knobs) -> float:
    """One of vLLM's own waits (an env var in seconds), as long as TIME_SCALE makes it in this run."""
    return seconds * knobs.time_scale


def env_name(knob: str) -> str:
    return ENV_PREFIX + knob.upper()


def flag_name(knob: str) -> str:
    return FLAG_PREFIX + knob.replace("_", "-")


def load_knobs(env: Mapping[str, str], flags: Mapping[str, str | None] | None = None) -> Knobs:
    """Knobs from the environment, overridden by ``--standin-*`` flag values keyed by knob name."""
    values: dict[str, object] = {}
    for knob in KNOB_NAMES:
        raw = (flags or {}).get(knob)
        source = flag_name(knob)
        if raw is None:
            raw = env.get(env_name(knob))
            source = env_name(knob)
        if raw is None:
            continue
        try:
            values[knob] = _PARSERS[knob](raw)
        except ValueError as exc:
            raise KnobError(f"invalid value for {source}: {raw!r}{_EXPECTED.get(knob, '')}") from exc
    return Knobs(**values)  # type: ignore[arg-type]


# Share of startup_seconds spent in each simulated load phase (sums to 1).
PHASE_SHARE = {
    "api": 0.05,
    "engine": 0.05,
    "distributed": 0.05,
    "weights": 0.40,
    "model": 0.05,
    "compile": 0.10,
    "profile": 0.10,
    "graphs": 0.15,
    "finish": 0.05,
}


def phase_seconds(knobs: Knobs, phase: str) -> float:
    return max(0.0, knobs.startup_seconds) * PHASE_SHARE[phase]

