"""Each part's own result made into the gate's :class:`~sparkd.supervisor.acceptance.gate.PartResult`: its verdict,
its sentence and the facts status shows. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from sparkd.supervisor.acceptance.capacity import CapacityResult
from sparkd.supervisor.acceptance.counters import PartVerdict
from sparkd.supervisor.acceptance.fingerprint import FingerprintResult
from sparkd.supervisor.acceptance.garble import LevelResult
from sparkd.supervisor.acceptance.gate import Part, PartResult

__all__ = ["capacity_part", "counters_part", "fingerprint_part", "garble_part", "incomplete_part"]


def capacity_part(result: CapacityResult, seconds: float = 0.0) -> PartResult:
    facts = {"lost_tokens": result.lost_tokens, "lost_share": result.lost_share, "lost_gib": result.lost_gib}
    return PartResult(Part.capacity, result.ok, result.sentence, seconds,
                      facts={k: v for k, v in facts.items() if v is not None})


def fingerprint_part(result: FingerprintResult, seconds: float) -> PartResult:
    facts: dict[str, object] = {"outcome": result.outcome.value, "exact": result.exact,
                                "differences": [f"{d.key}@{d.position}" for d in result.differences]}
    if result.similarity is not None:
        facts["similarity"] = round(result.similarity, 4)
    if result.identity_changes:
        facts["identity_changes"] = list(result.identity_changes)
    if result.recorded:
        facts["recorded"] = list(result.recorded)
    return PartResult(Part.fingerprint, result.ok, result.sentence, seconds, facts=facts)


def garble_part(levels: Sequence[LevelResult], seconds: float) -> PartResult:
    """Every level's ``bad_outputs``; any bad output fails the part."""
    facts = {"bad_outputs": {str(lv.level): lv.bad_outputs for lv in levels}}
    bad = [lv for lv in levels if lv.bad_outputs]
    if not bad:
        total = sum(lv.answers for lv in levels)
        said = ", ".join(str(lv.level) for lv in levels)
        return PartResult(Part.garble, True, f"{total} answers clean at concurrency {said}.", seconds, facts=facts)
    return PartResult(Part.garble, False, "garbled answers: " + "; ".join(lv.sentence() for lv in bad) + ".", seconds,
                      facts=facts)


def counters_part(part: Part, verdict: PartVerdict, seconds: float = 0.0) -> PartResult:
    return PartResult(part, verdict.ok, verdict.sentence, seconds, facts=dict(verdict.facts))


def incomplete_part(part: Part, why: str, seconds: float) -> PartResult:
    """A part that could not run to the end: not judged, and said."""
    return PartResult(part, None, why, seconds, incomplete=True)
