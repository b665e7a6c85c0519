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
    if not result.ok and result.differences:  # what the incident and `sparkd explain` quote
        first = result.differences[0]
        facts["first_difference"] = {"answer": first.key, "token": first.position, "golden": first.golden_text,
                                     "now": first.now_text}
    if result.identity_changes:
        facts["identity_changes"] = list(result.identity_changes)
    if result.recorded:
        facts["recorded"] = list(result.recorded)
    return PartResult(Part.fingerprint, result.ok, result.sentence, seconds, facts=facts)


def garble_part(levels: Sequence[LevelResult], seconds: float) -> PartResult:
    """Every level's ``bad_outputs``; any bad output fails the part — a request that failed among answered ones
    too (a concurrency bug), but when no request got an answer at all the part could not run (incomplete)."""
    facts = {"bad_outputs": {str(lv.level): lv.bad_outputs for lv in levels}}
    if levels and not any(lv.answers for lv in levels):
        return incomplete_part(Part.garble, f"no request got an answer ({levels[0].first()})", seconds)
    bad = [lv for lv in levels if lv.bad_outputs]
    total = sum(lv.answers + len(lv.errors) for lv in levels)
    if not bad:
        said = ", ".join(str(lv.level) for lv in levels)
        return PartResult(Part.garble, True, f"{total} answers clean at concurrency {said}.", seconds, facts=facts)
    per_level = ", ".join(f"{lv.bad_outputs} at {lv.level}" for lv in bad)
    return PartResult(Part.garble, False, f"{sum(lv.bad_outputs for lv in bad)} of {total} answers garbled "
                                          f"(concurrency: {per_level}); first: {bad[0].first()}.", seconds, facts=facts)


def counters_part(part: Part, verdict: PartVerdict, seconds: float = 0.0) -> PartResult:
    return PartResult(part, verdict.ok, verdict.sentence, seconds, facts=dict(verdict.facts))


def incomplete_part(part: Part, why: str, seconds: float) -> PartResult:
    """A part that could not run to the end: not judged, and said."""
    return PartResult(part, None, why, seconds, incomplete=True)
