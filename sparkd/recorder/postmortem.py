"""``sparkctl postmortem``: every node's ring on one clock, each silence explained in one sentence. Pure.

**One clock.** Every record carries its node's wall time, monotonic time and boot id. Each time a daemon polls a
peer's status (every ``peer_poll_s``) it notes the peer's wall clock minus its own, taken halfway through the
exchange (error: half the round trip, milliseconds on the fabric); every record keeps the latest figure per
peer. The postmortem takes the median of those figures and puts every node on the clock of the node it runs
on (through the head when two workers never talked). Without any figure the clocks are taken as in step (NTP)
and the report says so. Within a node, the order is the ring's sequence numbers.

**Silences.** A node's ring is cut into runs, one per sparkd process (boot id and run id). A run that ends
without the clean-exit record, and is not the one still recording, is a silence: the host froze or lost power,
or sparkd was killed. A node whose ring cannot be read gets its silence from the others' records: the last time
its heartbeat was fresh. Each silence is classified from its last minutes (:mod:`sparkd.recorder.rules`), and
what the other nodes did right after it ("rank 1 lost its peer 3 s later") is added.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd.recorder.excerpt import RunSummary, run_from_json
from sparkd.recorder.record import Record, from_json, to_json
from sparkd.recorder.rules import Cause, classify_silence, lost_peer_at

__all__ = ["WINDOW_S", "Finding", "NodeRing", "Report", "Silence", "analyse", "node_from_json", "offsets",
           "silences"]

WINDOW_S = 600.0  # the minutes before a silence that are read
AFTER_S = 120.0  # and the time after it in which the other nodes' reactions count


@dataclass(frozen=True)
class NodeRing:
    node: str
    rank: int | None = None
    role: str | None = None
    now: float | None = None  # its wall clock when it answered
    interval_s: float = 1.0
    runs: tuple[RunSummary, ...] = ()
    records: tuple[Record, ...] = ()
    error: str | None = None  # why its ring could not be read

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank} ({self.role or self.node})" if self.role else f"rank {self.rank}"
        return self.node


def node_from_json(data: Mapping[str, Any]) -> NodeRing:
    """One node's answer to the recorder command; bad records and runs are left out."""
    records, runs = [], []
    for item in data.get("records") or []:
        try:
            records.append(from_json(item))
        except (ValueError, TypeError):
            continue
    for item in data.get("runs") or []:
        try:
            runs.append(run_from_json(item))
        except ValueError:
            continue
    rank = data.get("rank")
    return NodeRing(node=str(data.get("node") or data.get("peer") or "?"),
                    rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                    role=data.get("role") if isinstance(data.get("role"), str) else None,
                    now=_float(data.get("now")), interval_s=_float(data.get("interval_s")) or 1.0,
                    runs=tuple(runs), records=tuple(sorted(records, key=lambda r: (r.wall, r.seq))),
                    error=data.get("error") if isinstance(data.get("error"), str) else None)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ---- one clock


def _edges(nodes: Sequence[NodeRing]) -> dict[tuple[str, str], float]:
    """(a, b) → median of b's wall clock minus a's, from a's records."""
    seen: dict[tuple[str, str], list[float]] = {}
    for n in nodes:
        for r in n.records:
            for p in r.peers:
                if p.offset_s is not None:
                    seen.setdefault((n.node, p.node), []).append(p.offset_s)
    return {pair: statistics.median(values) for pair, values in seen.items()}


def offsets(nodes: Sequence[NodeRing], reference: str) -> dict[str, float | None]:
    """Each node's wall clock minus the reference node's (None: never measured)."""
    edges = _edges(nodes)
    graph: dict[str, list[tuple[str, float]]] = {}
    for (a, b), off in edges.items():
        graph.setdefault(a, []).append((b, off))
        graph.setdefault(b, []).append((a, -off))
    known: dict[str, float] = {reference: 0.0}
    todo = [reference]
    while todo:
        a = todo.pop()
        for b, off in graph.get(a, []):
            if b not in known:
                known[b] = known[a] + off
                todo.append(b)
    return {n.node: known.get(n.node) for n in nodes}


# ---- silences


@dataclass(frozen=True)
class Silence:
    node: NodeRing
    at: float  # the node's own wall clock: its last record (or, inferred, its last fresh heartbeat)
    run: RunSummary | None
    after: RunSummary | None  # the run that followed (a new boot id: the host rebooted)
    inferred: bool = False


def silences(node: NodeRing) -> list[Silence]:
    """The runs of ``node`` that ended without a clean exit, except the one still recording."""
    runs = sorted(node.runs, key=lambda r: r.first)
    found = []
    for i, run in enumerate(runs):
        newest = i == len(runs) - 1
        live = newest and node.now is not None and node.now - run.last <= max(5 * node.interval_s, 10.0)
        if run.clean or live:
            continue
        found.append(Silence(node, run.last, run, runs[i + 1] if not newest else None))
    return found


def _inferred(node: NodeRing, others: Sequence[NodeRing]) -> Silence | None:
    """The last time another node heard ``node``'s sparkd (for a node whose ring could not be read)."""
    heard = [r.wall - (p.age_s or 0.0) for o in others for r in o.records for p in r.peers
             if p.node == node.node and p.up]
    return Silence(node, max(heard), None, None, inferred=True) if heard else None


# ---- findings


@dataclass(frozen=True)
class Finding:
    node: str
    label: str
    cls: str
    at: float  # the reference node's clock
    sentence: str
    evidence: tuple[Record, ...] = ()
    reactions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    reference: str
    since: float | None
    headline: str
    findings: tuple[Finding, ...] = ()
    clocks: dict[str, float | None] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "since": self.since, "headline": self.headline,
                "clocks": self.clocks, "unreadable": list(self.unreadable),
                "findings": [{"node": f.node, "label": f.label, "class": f.cls, "at": f.at, "sentence": f.sentence,
                              "reactions": list(f.reactions), "evidence": [to_json(r) for r in f.evidence]}
                             for f in self.findings]}


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _what_followed(s: Silence) -> str:
    if s.inferred:
        return "its own ring could not be read"
    if s.after is None:
        return "it has not recorded since"
    gap = s.after.first - s.at
    if s.after.boot != (s.run.boot if s.run else None):
        return f"the host rebooted and sparkd recorded again {_duration(gap)} later"
    return f"the host did not reboot: sparkd itself ended (killed or crashed) and came back {_duration(gap)} later"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _reactions(s: Silence, nodes: Sequence[NodeRing], clocks: Mapping[str, float | None], at_ref: float
               ) -> list[str]:
    out = []
    for other in nodes:
        if other.node == s.node.node:
            continue
        shift = clocks.get(other.node) or 0.0
        local = at_ref + shift  # the silence on the other node's clock
        lost = lost_peer_at([r for r in other.records if r.wall <= local + AFTER_S], s.node.node, local)
        if lost is not None:
            out.append(f"{other.label} lost its peer {lost[0] - local:.0f} s later ({lost[1]})")
    return out


def _finding(s: Silence, nodes: Sequence[NodeRing], clocks: Mapping[str, float | None]) -> Finding:
    own = clocks.get(s.node.node) or 0.0
    at_ref = s.at - own
    window = [r for r in s.node.records if s.at - WINDOW_S <= r.wall <= s.at
              and (s.run is None or (r.boot, r.run) == (s.run.boot, s.run.run))]
    cause = classify_silence(window) if window else Cause(
        "unknown", "went silent; none of its records of those minutes could be read", ())
    reactions = _reactions(s, nodes, clocks, at_ref)
    verb = cause.clause if window or not s.inferred else "went silent (the last heartbeat the others heard)"
    cls = cause.cls if window or not s.inferred else "unknown"
    sentence = f"{s.node.label} {verb}, at {_stamp(at_ref)}; {_what_followed(s)}"
    if reactions:
        sentence += "; " + "; ".join(reactions)
    return Finding(s.node.node, s.node.label, cls, at_ref, sentence + ".", cause.evidence, tuple(reactions))


def analyse(nodes: Sequence[NodeRing], reference: str, since: float | None = None) -> Report:
    """Every silence since ``since`` on every node, newest first, and the headline: the newest one's sentence."""
    clocks = offsets(nodes, reference)
    found: list[Silence] = []
    for node in nodes:
        if node.error is not None and not node.runs:
            inferred = _inferred(node, [n for n in nodes if n is not node])
            found.extend([inferred] if inferred is not None else [])
        else:
            found.extend(silences(node))
    if since is not None:
        found = [s for s in found if s.at - (clocks.get(s.node.node) or 0.0) >= since]
    findings = sorted((_finding(s, nodes, clocks) for s in found), key=lambda f: f.at, reverse=True)
    unreadable = tuple(f"{n.label}: {n.error}" for n in nodes if n.error is not None)
    if findings:
        headline = findings[0].sentence
    else:
        counted = ", ".join(f"{n.label}: {sum(r.count for r in n.runs)} records" for n in nodes if n.error is None)
        headline = f"No node went silent{' since ' + _stamp(since) if since else ''}: every run ended cleanly or " \
                   f"is still recording ({counted})."
    return Report(reference, since, headline, tuple(findings), dict(clocks), unreadable)
