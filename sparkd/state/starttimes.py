"""How long vLLM's starts took on this node, kept for the lint rule that judges ``VLLM_ENGINE_READY_TIMEOUT_S`` by
them (``engine-ready-timeout-below-cold-start``, :mod:`sparkd.launch.traps`).

What is kept of a start is the engine's part (:func:`engine_seconds`): from torch.distributed's init to the end of
the CUDA graph capture, the phases vLLM's API server waits out under ``VLLM_ENGINE_READY_TIMEOUT_S``, less the
engine's own imports (so a start that worked never reads as longer than the timeout it worked under). Two sources,
read together: ``start-times.json`` in the state directory, the last :data:`KEEP` starts (each: ``seconds``, ``at``
the wall time, ``launch_hash``), written when a start completes (the daemon's ``StartTimes`` view puts
:func:`with_start` through its state writer; :func:`record_start` writes at once); and ``status.json``'s
``start_timing`` (its ``phases_s``), the last start, which every daemon writes. A missing, unreadable or malformed
file is no measurement, never an error. An adopted instance's start is not timed.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

from sparkd.state.files import read_json, write_json

__all__ = ["ENGINE_PHASES", "KEEP", "START_TIMES", "engine_seconds", "measured_starts", "record_start",
           "with_start"]

START_TIMES = "start-times.json"
KEEP = 20
# The startup phases (sparkd.supervisor.progress.Phase values) inside the API server's wait for its engine.
ENGINE_PHASES = ("waiting_for_peer", "loading_weights", "compiling", "kv_cache", "graph_capture")


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def engine_seconds(timing: Any) -> float | None:
    """The engine's part of one start from its ``start_timing`` (``LaunchTiming.to_json()``), or None when it was
    not timed (adopted, no phases)."""
    if not isinstance(timing, dict) or timing.get("adopted") or not isinstance(timing.get("phases_s"), dict):
        return None
    parts = [_seconds(timing["phases_s"].get(phase)) for phase in ENGINE_PHASES]
    total = sum(p for p in parts if p is not None)
    return round(total, 1) if total > 0 else None


def measured_starts(state_dir: Path) -> tuple[float, ...]:
    """The engine's part of every start this node timed that the state directory still holds (seconds)."""
    out: list[float] = []
    kept = read_json(state_dir / START_TIMES) or {}
    for entry in kept.get("starts") or []:
        seconds = _seconds(entry.get("seconds")) if isinstance(entry, dict) else None
        if seconds is not None:
            out.append(seconds)
    status = read_json(state_dir / "status.json") or {}
    last = engine_seconds(status.get("start_timing"))
    if last is not None and not any(abs(last - seen) < 0.2 for seen in out):  # the same start, kept twice
        out.append(last)
    return tuple(out)


def with_start(kept: Any, seconds: float, *, at: float, launch_hash: str) -> dict[str, Any]:
    """``start-times.json``'s content ``kept`` (what :func:`read_json` made of it, None when missing) with one more
    completed start, ``seconds`` its engine's part, the oldest past :data:`KEEP` dropped."""
    starts = [e for e in (kept if isinstance(kept, dict) else {}).get("starts") or [] if isinstance(e, dict)]
    starts.append({"seconds": round(seconds, 1), "at": at, "launch_hash": launch_hash})
    return {"starts": starts[-KEEP:]}


def record_start(state_dir: Path, seconds: float, *, at: float, launch_hash: str) -> None:
    """Keep one completed start, ``seconds`` its engine's part (:func:`engine_seconds` of its timing); a write that
    fails costs only the record."""
    if _seconds(seconds) is None:
        return
    path = state_dir / START_TIMES
    with contextlib.suppress(OSError):
        write_json(path, with_start(read_json(path), seconds, at=at, launch_hash=launch_hash))
