"""Where a start's time goes: sparkd's own steps from "start requested" to "vLLM exec'd", split by preflight
check, and vLLM's cold-start phases (weights, compile and profile, KV cache, CUDA graphs, API server).

One :class:`LaunchTiming` per launch, filled in as it happens from monotonic times; ``to_json`` is what status
shows and metrics export, so an operator sees where an 8-minute start went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkd.supervisor.progress import PHASE_ORDER, Phase


@dataclass
class LaunchTiming:
    requested_at: float  # the lifecycle asked for a preflight (monotonic)
    steps: dict[str, float] = field(default_factory=dict)  # sparkd's own steps, seconds, in order
    exec_at: float | None = None  # the runtime reported vLLM's main process
    phase_at: dict[Phase, float] = field(default_factory=dict)  # when each startup phase was first seen
    ready_at: float | None = None
    adopted: bool = False  # phases replayed from an adopted instance's log: their times mean nothing

    def step(self, name: str, seconds: float) -> None:
        self.steps[name] = round(seconds, 4)

    def executed(self, at: float) -> None:
        """vLLM's main process runs: sparkd's part ends and vLLM's `launching` (imports, the engine core's spawn,
        half of a real 0.32 start) is timed from here like every later phase."""
        self.exec_at = at
        self.phase(Phase.launching, at)

    def phase(self, phase: Phase, at: float) -> None:
        self.phase_at.setdefault(phase, at)

    def phase_seconds(self) -> dict[str, float]:
        """Seconds spent in each phase reached, up to the next one (the last one up to ready)."""
        if self.adopted:
            return {}
        reached = [p for p in PHASE_ORDER if p in self.phase_at]
        out: dict[str, float] = {}
        for here, nxt in zip(reached, [*reached[1:], None], strict=False):
            end = self.phase_at[nxt] if nxt is not None else self.ready_at
            if end is not None:
                out[here.value] = round(end - self.phase_at[here], 3)
        return out

    def to_json(self) -> dict[str, Any]:
        overhead = None if self.exec_at is None else round(self.exec_at - self.requested_at, 4)
        cold = None if self.ready_at is None or self.exec_at is None or self.adopted else round(
            self.ready_at - self.exec_at, 3)
        return {"sparkd_s": overhead, "steps_s": dict(self.steps), "vllm_start_s": cold,
                "phases_s": self.phase_seconds(), "adopted": self.adopted}
