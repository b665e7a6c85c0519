"""What one node sends of its ring: the runs it holds (one per sparkd process), and the records of a time range.

A ring of a few MiB holds hours of records; ``sparkctl postmortem`` needs the list of runs (when each began and
ended, and whether it ended cleanly) and then only the minutes around each silence. Summaries read just the
fixed part of each record (:func:`sparkd.recorder.record.peek`), so listing a full ring stays cheap.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkd.recorder.record import decode, peek, to_json
from sparkd.recorder.ring import Frame, read_frames

__all__ = ["RunSummary", "records_between", "run_from_json", "summaries"]


@dataclass(frozen=True)
class RunSummary:
    """One sparkd process's stretch of the ring."""

    boot: str
    run: int
    first: float  # wall time of its first record in the ring
    last: float  # ... and of its last
    count: int
    clean: bool  # its last record says it exited cleanly

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_from_json(data: Any) -> RunSummary:
    if not isinstance(data, dict):
        raise ValueError("a run is an object")
    try:
        return RunSummary(str(data["boot"]), int(data["run"]), float(data["first"]), float(data["last"]),
                          int(data["count"]), bool(data["clean"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a run lacks {exc}") from None


def _summaries(frames: Iterable[Frame]) -> list[RunSummary]:
    runs: list[RunSummary] = []
    for f in sorted(frames, key=lambda f: f.seq):
        try:
            wall, boot, run, clean = peek(f.payload)
        except (ValueError, struct.error):
            continue
        last = runs[-1] if runs else None
        if last is not None and (last.boot, last.run) == (boot, run):
            runs[-1] = RunSummary(boot, run, last.first, wall, last.count + 1, clean)
        else:
            runs.append(RunSummary(boot, run, wall, wall, 1, clean))
    return runs


def summaries(path: Path, since: float | None = None) -> list[RunSummary]:
    """The runs in the ring, oldest first; with ``since``, those that recorded anything after it."""
    runs = _summaries(read_frames(path))
    return [r for r in runs if since is None or r.last >= since]


def records_between(path: Path, since: float, until: float) -> list[dict[str, Any]]:
    """The records (as JSON) whose wall time lies in ``[since, until]``, oldest first."""
    out = []
    for f in sorted(read_frames(path), key=lambda f: f.seq):
        with contextlib.suppress(ValueError, struct.error):
            wall = peek(f.payload)[0]
            if since <= wall <= until:
                out.append(to_json(decode(f.payload, f.seq)))
    return out
