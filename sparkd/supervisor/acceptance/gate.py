"""The acceptance gate composed: which parts run, their progress, and the one verdict they come to. Pure; times are
the caller's monotonic clock.

Rules:

1. Parts, in order: ``capacity`` (when on; it reads what startup logged), ``fingerprint`` (when on), ``garble`` (when
   levels are set), then ``spec_decode`` (when the launch sets a speculative config) and ``numerics`` (when the launch
   sets ``VLLM_COMPUTE_NANS_IN_LOGITS=1``), which read the counters moved by the requests before them.
2. The verdict is the gravest failed part's: ``corrupted`` (NaNs in the logits) before ``garbled`` before
   ``answers_changed`` (the answers are wrong), then ``capacity_lost`` before ``spec_decode_inactive`` (fewer or
   slower answers); the sentence names it first and the others after it. All passed (or could not be judged, said):
   ``pass``. A part that could not run to the end (no answer, the gate's budget) is ``incomplete``: said and served,
   never refused — the health checks judge a vLLM that does not answer.
3. Policy: the wrong-answer verdicts follow ``on_wrong_answers``, the others ``on_lost_performance``; ``refuse`` keeps
   the start from ready with a failure whose class is never restarted (:mod:`sparkd.supervisor.failures`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sparkd.supervisor.failures import Failure, FailureClass

__all__ = ["GateResult", "Part", "PartResult", "Progress", "Verdict", "decide", "plan"]


class Part(StrEnum):
    capacity = "capacity"
    fingerprint = "fingerprint"
    garble = "garble"
    spec_decode = "spec_decode"
    numerics = "numerics"


class Verdict(StrEnum):
    passed = "pass"
    corrupted = "corrupted"
    garbled = "garbled"
    answers_changed = "answers_changed"
    capacity_lost = "capacity_lost"
    spec_decode_inactive = "spec_decode_inactive"
    incomplete = "incomplete"


# The gravest first; the verdict each failed part gives.
ORDER = (Verdict.corrupted, Verdict.garbled, Verdict.answers_changed, Verdict.capacity_lost,
         Verdict.spec_decode_inactive)
VERDICT_OF = {Part.numerics: Verdict.corrupted, Part.garble: Verdict.garbled, Part.fingerprint: Verdict.answers_changed,
              Part.capacity: Verdict.capacity_lost, Part.spec_decode: Verdict.spec_decode_inactive}
WRONG_ANSWERS = frozenset({Verdict.corrupted, Verdict.garbled, Verdict.answers_changed})
FAILURE_CLASS = {Verdict.corrupted: FailureClass.answers_garbled, Verdict.garbled: FailureClass.answers_garbled,
                 Verdict.answers_changed: FailureClass.answers_changed,
                 Verdict.capacity_lost: FailureClass.capacity_lost,
                 Verdict.spec_decode_inactive: FailureClass.capacity_lost}


# What the operator does about each refusal (a restart never helps: the same launch answers the same).
FIX = {
    Verdict.answers_changed: "find what changed, or run `sparkctl accept` if the change was intended",
    Verdict.garbled: "check the image, its kernels and the quantization, then `sparkctl restart`",
    Verdict.corrupted: "check the image, its kernels and the quantization, then `sparkctl restart`",
    Verdict.capacity_lost: "free the memory (a reboot returns what the driver kept) or widen [acceptance]'s band, then "
                           "`sparkctl restart`",
    Verdict.spec_decode_inactive: "check the drafter (its weights, the image's speculative decoding), then "
                                  "`sparkctl restart`",
}


def plan(*, capacity: bool, fingerprint: bool, garble_levels: Sequence[int], spec_decode: bool, numerics: bool,
         speculative: bool, nans_in_logits: bool) -> tuple[Part, ...]:
    """The parts this start's gate runs, in order (the config's switches and what the launch sets)."""
    wanted = ((Part.capacity, capacity), (Part.fingerprint, fingerprint), (Part.garble, bool(garble_levels)),
              (Part.spec_decode, spec_decode and speculative), (Part.numerics, numerics and nans_in_logits))
    return tuple(part for part, on in wanted if on)


@dataclass(frozen=True)
class PartResult:
    part: Part
    ok: bool | None  # None: could not be judged (the sentence says why); not a failure
    sentence: str
    seconds: float = 0.0
    incomplete: bool = False  # it could not run to the end (no answer, the budget)
    facts: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part.value, "ok": self.ok, "sentence": self.sentence, "seconds": round(self.seconds, 3),
                "incomplete": self.incomplete, "facts": dict(self.facts)}


@dataclass(frozen=True)
class Progress:
    """The gate while it runs: what status shows (``accepting: fingerprint, 2 of 4 parts, 12 s``)."""

    started_at: float
    parts: tuple[Part, ...]
    done: tuple[PartResult, ...] = ()

    @property
    def current(self) -> Part | None:
        return self.parts[len(self.done)] if len(self.done) < len(self.parts) else None

    def after(self, result: PartResult) -> Progress:
        return Progress(self.started_at, self.parts, (*self.done, result))

    def line(self, now: float) -> str:
        doing = self.current.value if self.current is not None else "deciding"
        return f"{doing}, {len(self.done) + 1 if self.current else len(self.done)} of {len(self.parts)} parts, " \
               f"{now - self.started_at:.0f} s"


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    sentence: str
    refuse: bool  # the policy keeps this start from ready
    parts: tuple[PartResult, ...]
    started_at: float
    finished_at: float
    failure: Failure | None = None  # what a refusal (or a warning) reports; None when passed

    @property
    def seconds(self) -> float:
        return self.finished_at - self.started_at

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.passed

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "sentence": self.sentence, "refuse": self.refuse,
                "seconds": round(self.seconds, 3), "parts": [p.to_json() for p in self.parts],
                "class": None if self.failure is None else self.failure.cls.value}


def decide(results: Sequence[PartResult], *, started_at: float, now: float, on_wrong_answers: str = "refuse",
           on_lost_performance: str = "warn") -> GateResult:
    """The gate's verdict from its parts' results (rule 2) and what the policy makes of it (rule 3)."""
    failed = sorted((r for r in results if r.ok is False), key=lambda r: ORDER.index(VERDICT_OF[r.part]))
    if not failed:
        incomplete = [r for r in results if r.incomplete]
        if incomplete:
            said = "; ".join(f"{r.part}: {r.sentence}" for r in incomplete)
            return GateResult(Verdict.incomplete, f"The acceptance gate could not finish ({said}); vLLM serves "
                                                  "unverified.", False, tuple(results), started_at, now)
        checked = ", ".join(r.part.value for r in results if r.ok) or "nothing"
        return GateResult(Verdict.passed, f"The acceptance gate passed in {now - started_at:.1f} s ({checked}).",
                          False, tuple(results), started_at, now)
    worst = VERDICT_OF[failed[0].part]
    policy = on_wrong_answers if worst in WRONG_ANSWERS else on_lost_performance
    refuse = policy == "refuse"
    also = "".join(f" Also {r.part}: {r.sentence}" for r in failed[1:])
    action = f"sparkd keeps it from ready and does not restart it: {FIX[worst]}" if refuse else \
        "vLLM serves anyway ([acceptance] policy warn)"
    sentence = f"{_capital(failed[0].sentence)} — {action}.{also}"
    failure = Failure.of(FAILURE_CLASS[worst], sentence, evidence=_evidence(worst, failed[0]))
    return GateResult(worst, sentence, refuse, tuple(results), started_at, now, failure)


def _evidence(worst: Verdict, part: PartResult) -> str:
    """What the failure rests on, as the incident's verdict line keeps it (``sparkd explain`` quotes it): for changed
    answers the golden answer and the new one, each cut where the fingerprint cut it."""
    first = part.facts.get("first_difference")
    if not isinstance(first, Mapping):
        return f"acceptance {worst.value}: {part.sentence}"
    return (f"acceptance {worst.value}: {first.get('answer')} at token {first.get('token')}: the golden answered "
            f"{first.get('golden')!r}; now {first.get('now')!r}")


def _capital(text: str) -> str:
    text = text.rstrip(".")
    return text if text.startswith("vLLM") else text[:1].upper() + text[1:]
