"""What most likely happened before a node went silent: rules over its last records. Pure.

A silence is a run of records that ends without sparkd's clean exit. The rules read the records of its last
minutes (oldest first) and return the class and the clause that says why, with the records that show it. In
order, the first that holds wins:

1. ``gpu_error``: the kernel reported an Xid, a GPU off the bus or a fatal PCIe error in the last 2 minutes.
2. ``host_froze``: memory ran out: MemAvailable under the guard's stop floor, or under its warn floor with PSI
   ``full avg10`` at 40 % or more, or with ``NV_ERR_NO_MEMORY`` in the kernel log. The clause names the lowest
   floor crossed, how long before the silence it was crossed, the last value, the slope over the last minute,
   and what vLLM was doing.
3. ``oom``: the kernel's OOM killer killed a process in the last 2 minutes.
4. a failure sparkd recorded in the last 2 minutes (its class: ``killed_by_guard``, ``engine_dead``, …).
5. ``unknown``: nothing in the records explains it (a daemon killed on a healthy host reads like this).

The classes are the failure table's (:mod:`sparkd.supervisor.failures`) plus ``host_froze``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.guard.sample import GIB, MIB, gib
from sparkd.recorder.record import Floors, Record
from sparkd.supervisor.failures import FailureClass

__all__ = ["CLASSES", "Cause", "classify_silence", "lost_peer_at", "memory_trend"]

CLASSES = (*(c.value for c in FailureClass), "host_froze")
RECENT_S = 120.0
TREND_S = 60.0
PSI_FROZE = 40.0
DEFAULT_FLOORS = Floors(8 * GIB, 4 * GIB, 2 * GIB)
_GPU = re.compile(r"NVRM: Xid|fallen off the bus|AER: .*Uncorrect")
_OOM = re.compile(r"Out of memory: Killed process", re.IGNORECASE)
_FAILED = re.compile(r"→ (?:stopping|backoff|failed|stopped): (?P<cls>[a-z_]+): ")


@dataclass(frozen=True)
class Cause:
    cls: str
    clause: str  # "froze 14 s after MemAvailable fell below 768 MiB (…)"
    evidence: tuple[Record, ...]


def _recent(window: Sequence[Record], seconds: float) -> list[Record]:
    end = window[-1].wall
    return [r for r in window if r.wall >= end - seconds]


def _rate(per_s: float) -> str:
    if abs(per_s) >= MIB:
        return f"{abs(per_s) / MIB:.0f} MiB/s"
    return f"{abs(per_s) * 60 / MIB:.0f} MiB/min"


def memory_trend(window: Sequence[Record]) -> str | None:
    """How MemAvailable moved over the last minute of ``window``: "falling 290 MiB/s over the last 60 s"."""
    points = [r for r in _recent(window, TREND_S) if r.available is not None]
    if len(points) < 2 or points[-1].wall <= points[0].wall:
        return None
    first, last = points[0], points[-1]
    assert first.available is not None and last.available is not None
    slope = (last.available - first.available) / (last.wall - first.wall)
    way = "falling" if slope < 0 else "rising" if slope > 0 else "flat"
    span = last.wall - first.wall
    return f"{way} {_rate(slope)} over the last {span:.0f} s" if way != "flat" else f"flat over the last {span:.0f} s"


def _doing(r: Record) -> str:
    if r.state in ("ready", "degraded"):
        if r.running:
            tps = f", {r.prompt_tps:,.0f} prompt tokens/s" if r.prompt_tps else ""
            kv = f", KV cache {r.kv_usage * 100:.0f} % used" if r.kv_usage is not None else ""
            return f"while vLLM served {r.running} request{'s' if r.running != 1 else ''}{tps}{kv}"
        return "while vLLM was idle"
    if r.state == "starting":
        return f"while vLLM was starting ({r.phase or 'launching'})"
    if r.state == "preflight":
        return "during the preflight before a start"
    return f"while vLLM was {r.state or 'in an unknown state'}"


def _memory_cause(window: Sequence[Record]) -> Cause | None:
    last = window[-1]
    floors = last.floors or DEFAULT_FLOORS
    if last.available is None:
        return None
    nvrm = any("NV_ERR_NO_MEMORY" in line for r in _recent(window, TREND_S) for line in r.kernel)
    pressure = last.psi_full is not None and last.psi_full >= PSI_FROZE
    if not (last.available < floors.stop or (last.available < floors.warn and (pressure or nvrm))):
        return None
    names = ((floors.kill, "the guard's kill floor"), (floors.stop, "the guard's stop floor"),
             (floors.warn, "the guard's warn floor"))
    floor, name = next((f, n) for f, n in names if last.available < f)
    crossed = last
    for r in reversed(window):
        if r.available is None or r.available >= floor:
            break
        crossed = r
    parts = [f"{name}; {gib(last.available)} in its last record"]
    trend = memory_trend(window)
    if trend:
        parts.append(trend)
    if last.psi_full is not None and last.psi_full >= 10:
        parts.append(f"PSI full {last.psi_full:.0f} %")
    if nvrm:
        parts.append("NV_ERR_NO_MEMORY in the kernel log")
    clause = (f"froze {last.wall - crossed.wall:.0f} s after MemAvailable fell below {gib(floor)} "
              f"({', '.join(parts)}) {_doing(last)}")
    return Cause("host_froze", clause, (crossed, last) if crossed is not last else (last,))


def _kernel_cause(window: Sequence[Record], pattern: re.Pattern[str], cls: str, what: str) -> Cause | None:
    for r in _recent(window, RECENT_S):
        for line in r.kernel:
            if pattern.search(line):
                later = window[-1].wall - r.wall
                return Cause(cls, f"went silent {later:.0f} s after {what} ({line.strip()[:160]}) {_doing(window[-1])}",
                             (r, window[-1]))
    return None


def _failure_cause(window: Sequence[Record]) -> Cause | None:
    for r in reversed(_recent(window, RECENT_S)):
        for event in r.events:
            m = _FAILED.search(event)
            if m and m.group("cls") in CLASSES:
                later = window[-1].wall - r.wall
                return Cause(m.group("cls"), f"went silent {later:.0f} s after sparkd recorded {event[:200]}",
                             (r, window[-1]))
    return None


def classify_silence(window: Sequence[Record]) -> Cause:
    """The most likely cause of a silence, from the records before it (oldest first, at least one)."""
    if not window:
        return Cause("unknown", "went silent with no record left to read", ())
    cause = (_kernel_cause(window, _GPU, "gpu_error", "the GPU reported a fault")
             or _memory_cause(window)
             or _kernel_cause(window, _OOM, "oom", "the kernel's OOM killer killed a process")
             or _failure_cause(window))
    if cause is not None:
        return cause
    last = window[-1]
    memory = f"MemAvailable {gib(last.available)}" if last.available is not None else "memory unknown"
    return Cause("unknown", f"went silent with nothing in its last records to explain it ({memory}, no kernel "
                 f"error) {_doing(last)}", (last,))


def lost_peer_at(records: Sequence[Record], peer: str, after: float) -> tuple[float, str] | None:
    """When a node lost ``peer`` after ``after`` (its own wall clock): the first ``peer_lost`` failure it recorded,
    else the first record that shows the peer not answering; (time, how)."""
    for r in records:
        if r.wall >= after and any(": peer_lost: " in e for e in r.events):
            return r.wall, "sparkd declared peer_lost"
    for r in records:
        if r.wall >= after and any(p.node == peer and not p.up for p in r.peers):
            return r.wall, "its peer's sparkd stopped answering"
    return None
