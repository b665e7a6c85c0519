"""How long vLLM's starts took on this node, kept for the lint rule that judges ``VLLM_ENGINE_READY_TIMEOUT_S`` by
them (``engine-ready-timeout-below-cold-start``, :mod:`sparkd.launch.traps`).

Two sources, read together: ``start-times.json`` in the state directory, the last :data:`KEEP` starts (each:
``seconds`` from vLLM's exec to ready, ``at`` the wall time, ``launch_hash``), written by :func:`record_start` when a
start completes; and ``status.json``'s ``start_timing.vllm_start_s``, the last start, which every daemon writes. A
missing, unreadable or malformed file is no measurement, never an error. An adopted instance's start is not timed.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

from sparkd.state.files import read_json, write_json

__all__ = ["KEEP", "START_TIMES", "measured_starts", "record_start"]

START_TIMES = "start-times.json"
KEEP = 20


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def measured_starts(state_dir: Path) -> tuple[float, ...]:
    """Every start this node timed (seconds, exec to ready) that the state directory still holds."""
    out: list[float] = []
    kept = read_json(state_dir / START_TIMES) or {}
    for entry in kept.get("starts") or []:
        seconds = _seconds(entry.get("seconds")) if isinstance(entry, dict) else None
        if seconds is not None:
            out.append(seconds)
    status = read_json(state_dir / "status.json") or {}
    timing = status.get("start_timing")
    last = _seconds(timing.get("vllm_start_s")) if isinstance(timing, dict) and not timing.get("adopted") else None
    if last is not None and not any(abs(last - seen) < 0.2 for seen in out):  # the same start, kept twice
        out.append(last)
    return tuple(out)


def record_start(state_dir: Path, seconds: float, *, at: float, launch_hash: str) -> None:
    """Keep one completed start (the daemon calls this at ``ready``; a write that fails costs only the record)."""
    if _seconds(seconds) is None:
        return
    path = state_dir / START_TIMES
    starts = [e for e in (read_json(path) or {}).get("starts") or [] if isinstance(e, dict)]
    starts.append({"seconds": round(seconds, 1), "at": at, "launch_hash": launch_hash})
    with contextlib.suppress(OSError):
        write_json(path, {"starts": starts[-KEEP:]})
