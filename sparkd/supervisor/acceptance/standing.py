"""The node's acceptance gate as its state holds it: the run in progress, the current instance's last verdict, and the
recent runs (issue 37). Pure values; the loop's fold (:mod:`sparkd.daemon.loop.nodestate`) takes them from the
observations that carry them (``GateProgress``, ``GateDone``), and the views read them.

Rules:

1. A run is one of :class:`GateKind`: ``start`` (between starting and ready, every part), ``adopted`` (an instance
   found at boot, serving already: a replay), ``replay`` (while idle, at ``[acceptance] replay_interval_s``),
   ``wake`` (after vLLM woke from sleep) and ``accept`` (``sparkctl accept``: every part, its answers the golden).
2. ``last`` is the verdict standing for the instance that runs: a new launch or a stop clears it (the history keeps
   it), and so does a start's or an accept's verdict; a replay's pass does not clear a failure standing (it asks
   less than a start, and a drift that comes and goes is the operator's to judge). ``runs`` counts every run taken
   since the daemon started, by kind and verdict (the metrics' counter).
3. The history keeps the last :data:`HISTORY` runs, each with its kind, verdict, seconds, sentence, and when it ended
   (monotonic: the views give wall time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from sparkd.supervisor.acceptance.gate import WRONG_ANSWERS, GateResult, Progress, Verdict

__all__ = ["HISTORY", "REPLAYS", "GateKind", "GateRun", "Standing"]

HISTORY = 20


class GateKind(StrEnum):
    start = "start"
    adopted = "adopted"
    replay = "replay"
    wake = "wake"
    accept = "accept"


# What runs only the replay's parts (the fingerprint, numerics): vLLM serves users already.
REPLAYS = frozenset({GateKind.adopted, GateKind.replay, GateKind.wake})


@dataclass(frozen=True)
class GateRun:
    kind: GateKind
    verdict: Verdict
    seconds: float
    finished_at: float  # monotonic
    sentence: str
    refused: bool

    @classmethod
    def of(cls, result: GateResult, kind: GateKind) -> GateRun:
        return cls(kind, result.verdict, round(result.seconds, 3), result.finished_at, result.sentence, result.refuse)

    def to_json(self, wall: float | None) -> dict[str, Any]:
        return {"at": wall, "kind": self.kind.value, "verdict": self.verdict.value, "seconds": self.seconds,
                "refused": self.refused, "sentence": self.sentence}


@dataclass(frozen=True)
class Standing:
    running: Progress | None = None  # the run in progress
    running_kind: GateKind | None = None
    last: GateResult | None = None  # the verdict standing for the running instance
    last_kind: GateKind | None = None
    history: tuple[GateRun, ...] = ()
    runs: Mapping[tuple[GateKind, Verdict], int] = field(default_factory=dict)

    @property
    def wrong_answers(self) -> str | None:
        """The standing verdict's sentence while it says the running vLLM answers wrong (changed, garbled, NaNs):
        what a notifier's ``Snapshot.answers`` carries (sparkd.notify.events)."""
        last = self.last
        return last.sentence if last is not None and last.verdict in WRONG_ANSWERS else None

    def progressed(self, progress: Progress | None, kind: GateKind | None) -> Standing:
        """A run began or moved on (None: it ended without a verdict: cancelled with its instance)."""
        return replace(self, running=progress, running_kind=kind if progress is not None else None)

    def took(self, result: GateResult, kind: GateKind) -> Standing:
        runs = {**self.runs, (kind, result.verdict): self.runs.get((kind, result.verdict), 0) + 1}
        history = (*self.history, GateRun.of(result, kind))[-HISTORY:]
        if kind in REPLAYS and result.failure is None and self.last is not None and self.last.failure is not None:
            return Standing(None, None, self.last, self.last_kind, history, runs)  # the failure stands
        return Standing(None, None, result, kind, history, runs)

    def new_instance(self) -> Standing:
        """The instance the verdict stood for is gone (a stop), or another one runs (a launch)."""
        if self.last is None and self.running is None:
            return self
        return replace(self, running=None, running_kind=None, last=None, last_kind=None)

    def view(self, now: float, wall: Callable[[float], float | None]) -> dict[str, Any]:
        """What status shows: the run in progress (its line), the standing verdict with its parts, the history."""
        last = self.last
        out: dict[str, Any] = {
            "running": None if self.running is None else {
                "kind": self.running_kind.value if self.running_kind else None, "line": self.running.line(now)},
            "verdict": last.verdict.value if last else None, "refused": last.refuse if last else False,
            "kind": self.last_kind.value if self.last_kind else None,
            "at": wall(last.finished_at) if last else None,
            "history": [run.to_json(wall(run.finished_at)) for run in self.history],
        }
        if last is not None:
            out.update({k: v for k, v in last.to_json().items() if k not in ("verdict", "refuse")})
        return out
