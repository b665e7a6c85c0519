"""The step probe in bench_wedge.py's worlds (issue 38): what each rank's step file would hold at a moment of a world,
as the daemon's reading of it (``Ranks.nodes``), which bench_wedge.py folds in with the daemon's own combination
(sparkd.supervisor.stepwatch.observe_steps, every ``READ_EVERY_S``).

Every visible rank of a world holds the same record (a tensor-parallel step begins and ends on every rank; a wedged
collective keeps every rank inside it); a lost peer's rank has no reading (its sparkd is gone), so its rows show the
probe's silence there.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from wedge_worlds import World

from sparkd.supervisor.stephistory import StepLimits
from sparkd.supervisor.steps import NodeSteps
from sparkd.supervisor.stepwatch import READ_EVERY_S
from sparkd.vllm_probe.sparkd_vllm_probe.layout import UNKNOWN, StepRecord

__all__ = ["READ_EVERY_S", "Ranks"]
NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return int((seconds + 1.0) * NS)  # 0 means "never" in a record: the world's clock starts at 1 s


@dataclass
class Ranks:
    """The probe of one world: ``visible`` ranks of a world of ``world_size`` (a lost peer's are not visible)."""

    world: World
    world_size: int
    visible: tuple[int, ...]
    limits: StepLimits
    _spans_seen: int = -1
    _longest: list[tuple[float, int]] = field(default_factory=list)  # prefix max of (duration, tokens)

    def _refresh(self) -> None:
        if self._spans_seen == len(self.world.spans):
            return
        best: tuple[float, int] = (0.0, 0)
        self._longest = []
        for began, ended, tokens in self.world.spans:
            if ended < math.inf and ended - began > best[0]:
                best = (ended - began, tokens)
            self._longest.append(best)
        self._spans_seen = len(self.world.spans)

    def records(self, t: float) -> tuple[StepRecord, ...]:
        """Every visible rank's record at world time ``t`` (spans do not overlap: one step at a time)."""
        self._refresh()
        spans = self.world.spans
        i = bisect.bisect_right(spans, (t, math.inf, 1 << 62)) - 1
        if i < 0:
            fields = {"step": 0, "phase": "idle", "began_ns": 0, "ended_ns": 0, "tokens": UNKNOWN}
            longest: tuple[float, int] = (0.0, 0)
        else:
            began, ended, tokens = spans[i]
            inside = ended > t
            done = i if inside else i + 1
            last_end = spans[i - 1][1] if inside and i > 0 else (ended if not inside else 0.0)
            fields = {"step": done + (1 if inside else 0), "phase": "step" if inside else "idle",
                      "began_ns": _ns(began), "ended_ns": _ns(last_end) if last_end else 0, "tokens": tokens}
            longest = self._longest[i - 1] if inside and i > 0 else (self._longest[i] if not inside else (0.0, 0))
        return tuple(StepRecord(
            role="worker", rank=r, local_rank=r, world_size=self.world_size, pid=100 + r, pid_ns=0, start_ticks=0,
            anchor_mono_ns=0, anchor_wall_ns=0, held=UNKNOWN, last_ns=0, last_tokens=UNKNOWN,
            longest_ns=int(longest[0] * NS), longest_tokens=longest[1], host="bench", boot_id="", title="",
            vllm="", note="", **fields) for r in self.visible)  # type: ignore[arg-type]

    def nodes(self, t: float) -> list[NodeSteps]:
        """The daemon's reading at world time ``t`` (one node holds the visible ranks; its clock is the world's)."""
        return [NodeSteps("bench", _ns(t), self.records(t), t)]
