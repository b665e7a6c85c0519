"""Memory that does not come back: the settle wait before a start, and the restart gate. Pure.

**Settle.** After vLLM is killed, the reaper of its process can hold tens of GiB for a while; a start in that
window finds too little memory, or takes what the host needs. Before every start sparkd waits until MemAvailable
has stayed within ``band`` for ``settle_s`` (:func:`settled`), at most ``settle_timeout_s``. The settled value,
taken with nothing of vLLM's running, is the node's **baseline** for that start. A restart whose memory is already
back where the last start found it (:func:`back`: within half of ``min_fall`` of the last baseline) waits no longer:
nothing is held any more, and no fall could be read from waiting (a restart's memory settle was sparkd's whole
overhead on the real vLLM, tests/bench/README.md §11).

**The gate.** On GB10 a killed vLLM can leave memory the driver never gives back (UVM): every restart then starts
from a lower baseline, until the host freezes. :func:`reboot_verdict` reads the baselines of this boot: when the
last ``falls`` of them each fell by at least ``min_fall`` (or, after at least two falls, the next would bring
the baseline under ``floor``, the guard's refuse-start floor), sparkd stops restarting and says "reboot needed:
N restarts lost X GiB that was never returned". An operator's reset starts the count over.

A fall counts only as far as the driver's share rose with it: memory the driver holds is in no named field of
``/proc/meminfo`` (the residual, :attr:`sparkd.guard.meminfo.MemInfo.driver_residual`), where a process that grew
beside vLLM — a neighbour's job, a leak, another vLLM on the CPU — holds pages (Active, Inactive, Slab). A host
whose other processes took 2.5 GiB between two restarts needs no reboot (a soak beside the suite's real vLLM read
one: MemAvailable 21.9 → 21.1 → 19.5 GiB after each stop).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.guard.sample import gib

__all__ = ["Baseline", "Verdict", "back", "reboot_verdict", "settled"]


@dataclass(frozen=True)
class Baseline:
    at: float  # wall time of the settle
    available: int  # settled MemAvailable, bytes
    residual: int | None = None  # the driver's share then (meminfo's residual), bytes; None: not read


def _fall(older: Baseline, newer: Baseline) -> int:
    """How much of the memory a step lost no process holds: the fall of MemAvailable, at most the rise of the
    driver's share where both were read."""
    fall = older.available - newer.available
    if older.residual is not None and newer.residual is not None:
        fall = min(fall, newer.residual - older.residual)
    return fall


@dataclass(frozen=True)
class Verdict:
    falls: int
    lost: int  # bytes between the first and the last baseline of the run of falls
    sentence: str


def settled(samples: Sequence[tuple[float, int]], now: float, settle_s: float, band: int,
            max_gap_s: float | None = None) -> int | None:
    """The settled MemAvailable (the median of the window) when the samples of the last ``settle_s`` seconds
    (``(monotonic time, bytes)``, oldest first; the last one taken before the window counts as its start) stay
    within ``band``; else None. ``max_gap_s``: the longest time between two samples of the window that still
    counts as watched — a gap longer than the sampling cadence (no samples while vLLM ran, then one now) says
    nothing about what the memory did in it."""
    if settle_s <= 0:
        return samples[-1][1] if samples else None
    start = now - settle_s
    before = [(at, value) for at, value in samples if at <= start]
    if not before:
        return None  # the samples do not reach back to the window's start yet
    window = [before[-1], *((at, value) for at, value in samples if at > start)]
    values = [value for _, value in window]
    if len(window) < 2 or max(values) - min(values) > band:
        return None
    if max_gap_s is not None and any(b[0] - a[0] > max_gap_s for a, b in itertools.pairwise(window)):
        return None
    return int(statistics.median(values))


def back(samples: Sequence[tuple[float, int]], last: Baseline | None, min_fall: int) -> int | None:
    """The newest MemAvailable when it is back where the last start found it (within half of ``min_fall``, the
    smallest fall the gate counts): the baseline of this start at once; else None (the settle goes on)."""
    if last is None or not samples:
        return None
    newest = samples[-1][1]
    return newest if newest >= last.available - min_fall // 2 else None


def _falls(baselines: Sequence[Baseline], min_fall: int) -> list[int]:
    """The newest steps that were each a fall of at least ``min_fall`` (newest first)."""
    falls = []
    for newer, older in zip(reversed(baselines[1:]), reversed(baselines[:-1]), strict=True):
        fall = _fall(older, newer)
        if fall < max(min_fall, 1):
            break
        falls.append(fall)
    return falls


def reboot_verdict(baselines: Sequence[Baseline], *, falls: int, min_fall: int, floor: int) -> Verdict | None:
    """Whether to stop restarting, from this boot's baselines (oldest first); None: restarting is safe."""
    if falls <= 0 or len(baselines) < 2:
        return None
    values = [b.available for b in baselines]
    run = _falls(baselines, min_fall)
    count = len(run)
    if count == 0:
        return None
    lost = sum(run)
    trail = " → ".join(gib(v) for v in values[-1 - count:])
    restarts = "restart" if count == 1 else "restarts"
    if count >= falls:
        why = f"MemAvailable after each stop: {trail}"
    elif count >= 2 and values[-1] - lost / count < floor:
        why = (f"MemAvailable after each stop: {trail}; one more would leave under {gib(floor)}, the floor under "
               "which the guard refuses a start")
    else:
        return None
    return Verdict(count, lost, f"reboot needed: {count} {restarts} lost {gib(lost)} that was never returned "
                                f"({why}); the driver keeps memory a killed vLLM held, so sparkd stops restarting "
                                "before the host freezes — reboot the node, then `sparkctl reset`")
