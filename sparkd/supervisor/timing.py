"""Where a start's time goes: sparkd's own steps from "start requested" to "vLLM exec'd", split by preflight
check, vLLM's cold-start phases (weights, compile and profile, KV cache, CUDA graphs, API server), and the
acceptance gate between vLLM's first answer and ready (``accept_s``).

One :class:`LaunchTiming` per launch, a value: the preflight makes it and times its steps, the launch adds its own
and vLLM's exec (``PreflightDone`` and ``Launched`` carry it), the node's state adds each phase as it is first
seen, what the log said of the compile cache (``CompileCacheRead``) and ready. ``to_json`` is what status shows,
metrics export and the incident of a start that failed keeps (its last phase up to the failure), so an operator
sees where an 8-minute start went.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sparkd.supervisor.compilelog import CompileCache, Verdict
from sparkd.supervisor.progress import PHASE_ORDER, Phase


@dataclass(frozen=True)
class LaunchTiming:
    requested_at: float  # the lifecycle asked for a preflight (monotonic)
    steps: Mapping[str, float] = field(default_factory=dict)  # sparkd's own steps, seconds, in order
    exec_at: float | None = None  # the runtime reported vLLM's main process
    phase_at: Mapping[Phase, float] = field(default_factory=dict)  # when each startup phase was first seen
    ready_at: float | None = None
    accepting_at: float | None = None  # vLLM answered; the acceptance gate ran from here to ready
    adopted: bool = False  # phases replayed from an adopted instance's log: their times mean nothing
    compile: CompileCache | None = None  # what the start's log said of vLLM's compile cache
    compile_expected: bool = False  # a hit was due: the last start stored the same entry
    compile_explained: str | None = None  # what explains a miss ("image changed")

    def step(self, name: str, seconds: float) -> LaunchTiming:
        return replace(self, steps={**self.steps, name: round(seconds, 4)})

    def executed(self, at: float) -> LaunchTiming:
        """vLLM's main process runs: sparkd's part ends and vLLM's `launching` (imports, the engine core's spawn,
        half of a real 0.32 start) is timed from here like every later phase."""
        return replace(self, exec_at=at).phase(Phase.launching, at)

    def phase(self, phase: Phase, at: float) -> LaunchTiming:
        """``phase`` first seen at ``at`` (a phase seen again keeps its first time)."""
        return self if phase in self.phase_at else replace(self, phase_at={**self.phase_at, phase: at})

    def ready(self, at: float) -> LaunchTiming:
        return self if self.ready_at is not None else replace(self, ready_at=at)

    def accepting(self, at: float) -> LaunchTiming:
        """vLLM's own start is over (its first /health 200); the acceptance gate's begins."""
        return self if self.accepting_at is not None else replace(self, accepting_at=at)

    @property
    def served_at(self) -> float | None:
        """When vLLM's own start ended: its first /health 200 (the gate's time is not vLLM's)."""
        return self.accepting_at if self.accepting_at is not None else self.ready_at

    def compiled(self, cache: CompileCache, expected: bool, explained: str | None) -> LaunchTiming:
        return replace(self, compile=cache, compile_expected=expected, compile_explained=explained)

    @property
    def unexpected_miss(self) -> bool:
        """The compile cache missed where the last start stored the same entry: a warning."""
        return self.compile is not None and self.compile.verdict is Verdict.miss and self.compile_expected

    def compile_json(self) -> dict[str, Any] | None:
        """``{"verdict": "hit", "seconds": 12.0, "sentence": "compile cache hit, 12 s", ...}``; None before vLLM's
        log says anything of its compile cache."""
        cache = self.compile
        if cache is None or cache.verdict is Verdict.unknown:
            return None
        return {**cache.to_json(), "expected": self.compile_expected, "explained": self.compile_explained,
                "unexpected_miss": self.unexpected_miss,
                "sentence": cache.sentence(self.compile_expected, self.compile_explained)}

    def phase_seconds(self, until: float | None = None) -> dict[str, float]:
        """Seconds spent in each phase reached, up to the next one (the last one up to vLLM's first answer, or
        ``until``: where a start that never became ready ended)."""
        if self.adopted:
            return {}
        reached = [p for p in PHASE_ORDER if p in self.phase_at]
        out: dict[str, float] = {}
        for here, nxt in zip(reached, [*reached[1:], None], strict=False):
            end = self.phase_at[nxt] if nxt is not None else self.served_at if self.served_at is not None else until
            if end is not None:
                out[here.value] = round(max(0.0, end - self.phase_at[here]), 3)
        return out

    def to_json(self, until: float | None = None) -> dict[str, Any]:
        """``until``: a start that failed ended then (its last phase lasted until it)."""
        overhead = None if self.exec_at is None else round(self.exec_at - self.requested_at, 4)
        served = self.served_at
        cold = None if served is None or self.exec_at is None or self.adopted else round(served - self.exec_at, 3)
        gate = None if self.accepting_at is None or self.ready_at is None else round(
            self.ready_at - self.accepting_at, 3)
        return {"sparkd_s": overhead, "steps_s": dict(self.steps), "vllm_start_s": cold,
                "phases_s": self.phase_seconds(until), "accept_s": gate, "adopted": self.adopted,
                "compile_cache": self.compile_json()}
