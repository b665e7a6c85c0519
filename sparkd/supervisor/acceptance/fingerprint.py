"""The answer fingerprint: a start's answers against the golden. Pure.

Rules:

1. No golden for this model, or one asked with another request shape (max_tokens, seed, top_logprobs): the answers
   are recorded as the golden (``recorded``). A prompt the golden lacks is recorded beside the others.
2. The same identity (image, weights, launch): every answer's token ids must be the golden's, exactly. Measured on
   vLLM's CPU build: 10 restarts gave bit-identical tokens and log-probabilities (tests/realvllm/README.md).
3. The identity changed (an upgrade, new weights, new flags): the answers must still agree closely. An answer may
   part from the golden's only (a) after its first ``prefix_tokens`` tokens, or (b) at a near tie: the new token is
   among the golden's top log-probabilities there, within ``tie_margin`` nats of the golden's own choice (a
   numerics change can only flip a near tie; new weights or a broken kernel choose tokens the golden never
   considered). And over all prompts, the share of golden tokens still in the common prefix must reach
   ``min_similarity``.
4. A mismatch is ``changed``, with one sentence: the prompt, the first differing token (its text and id, both
   sides), and what changed in the identity since the golden (or that nothing did).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from sparkd.supervisor.acceptance.answers import Answer, Capacity, Golden, Identity, Shape

__all__ = ["Difference", "FingerprintResult", "Outcome", "Rules", "common_prefix", "compare", "near_tie"]


QUOTE = 400  # characters of each answer a difference keeps


@dataclass(frozen=True)
class Rules:
    prefix_tokens: int = 8
    tie_margin: float = 0.5
    min_similarity: float = 0.5


class Outcome(StrEnum):
    recorded = "recorded"  # no golden to compare with: these answers are the golden now
    matched = "matched"
    changed = "changed"


@dataclass(frozen=True)
class Difference:
    key: str  # "capital/chat"
    position: int  # the first token that differs
    golden: str  # that token in the golden ("' Paris' (id 3681)")
    now: str  # that token now
    near_tie: bool  # the golden's top log-probabilities had the new token within the tie margin
    golden_text: str = ""  # both answers, for the incident and `sparkd explain` (cut to QUOTE characters)
    now_text: str = ""


@dataclass(frozen=True)
class FingerprintResult:
    outcome: Outcome
    sentence: str
    exact: bool  # compared exactly (the identity is the golden's)
    differences: tuple[Difference, ...] = ()  # every answer that differs, tolerated or not
    similarity: float | None = None  # the share of golden tokens in the common prefixes (None: nothing compared)
    identity_changes: tuple[str, ...] = ()
    recorded: tuple[str, ...] = ()  # keys recorded anew
    golden: Golden | None = None  # the golden to keep when it is new or grew; None: unchanged

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.changed


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def near_tie(golden: Answer, now: Answer, position: int, margin: float) -> bool:
    """At ``position`` the golden's top log-probabilities (or the new answer's) hold both tokens within ``margin``."""
    for ours, theirs in ((golden, now), (now, golden)):
        if position >= len(ours.top) or position >= len(theirs.tokens) or not ours.top[position]:
            continue
        chosen = ours.top[position][0][1]
        other = dict(ours.top[position]).get(theirs.tokens[position])
        if other is not None and chosen - other <= margin:
            return True
    return False


def _difference(golden: Answer, now: Answer, margin: float) -> Difference | None:
    p = common_prefix(golden.token_ids, now.token_ids)
    if p == len(golden.token_ids) == len(now.token_ids):
        return None
    return Difference(golden.key, p, golden.token(p), now.token(p), near_tie(golden, now, p, margin),
                      golden.text[:QUOTE], now.text[:QUOTE])


def compare(golden: Golden | None, answers: Sequence[Answer], identity: Identity, shape: Shape, rules: Rules, *,
            model: str, now_wall: float, capacity: Capacity | None = None, accept: bool = False) -> FingerprintResult:
    """The fingerprint's verdict on ``answers`` made under ``identity`` with ``shape``; see the module's rules.
    ``accept``: the answers become the golden whatever it held (``sparkctl accept``)."""
    if accept or golden is None or golden.model != model or golden.shape != shape:
        fresh = Golden(identity, shape, {a.key: a for a in answers}, capacity, now_wall, model)
        why = _why_recorded(golden, model, shape, identity, accept)
        return FingerprintResult(Outcome.recorded, f"{len(answers)} answers recorded as the golden ({why}).",
                                 exact=False, recorded=tuple(a.key for a in answers), golden=fresh)
    changes = tuple(golden.identity.changes(identity))
    known = [a for a in answers if a.key in golden.answers]
    new = [a for a in answers if a.key not in golden.answers]
    grown = replace(golden, answers={**golden.answers, **{a.key: a for a in new}}) if new else None
    pairs = [(golden.answers[a.key], a) for a in known]
    differences = tuple(d for g, a in pairs if (d := _difference(g, a, rules.tie_margin)) is not None)
    total = sum(len(g.token_ids) for g, _ in pairs)
    similarity = (sum(min(common_prefix(g.token_ids, a.token_ids), len(g.token_ids)) for g, a in pairs) / total
                  if total else None)

    def result(outcome: Outcome, sentence: str) -> FingerprintResult:
        return FingerprintResult(outcome, sentence, exact=not changes, differences=differences, similarity=similarity,
                                 identity_changes=changes, recorded=tuple(a.key for a in new), golden=grown)

    bad = _unaccepted(differences, bool(changes), rules)
    if bad is None and changes and similarity is not None and similarity < rules.min_similarity:
        return result(Outcome.changed, f"After {_and(changes)} changed since the golden, only {similarity:.0%} of the "
                                       f"answer tokens agree with it (at least {rules.min_similarity:.0%} must); the "
                                       f"first difference: {_where(differences[0])}.")
    if bad is not None:
        since = (f"since the golden, {_and(changes)} changed" if changes else
                 "nothing in the identity changed since the golden (same image, weights and launch): the engine "
                 "computes differently (a kernel, the GPU, its memory)")
        return result(Outcome.changed, f"{_where(bad)}; {since}.")
    return result(Outcome.matched, _matched(len(pairs), differences, changes, new))


def _unaccepted(differences: tuple[Difference, ...], changed: bool, rules: Rules) -> Difference | None:
    """The first difference the rules do not allow (any, under the same identity)."""
    for d in differences:
        if not changed or not (d.position >= rules.prefix_tokens or d.near_tie):
            return d
    return None


def _where(d: Difference) -> str:
    prompt, api = d.key.split("/", 1)
    return (f"The answer to prompt {prompt!r} ({api}) differs from the golden at token {d.position}: "
            f"{d.golden} became {d.now}")


def _matched(compared: int, differences: tuple[Difference, ...], changes: tuple[str, ...], new: list[Answer]) -> str:
    said = f"{compared} answers match the golden"
    if changes:
        parted = f"; {len(differences)} part from it at a near tie or past the prefix" if differences else ""
        said = f"{said} closely after {_and(changes)} changed{parted}"
    else:
        said += " exactly"
    if new:
        said += f"; {len(new)} new ({', '.join(a.key for a in new)}) recorded"
    return said + "."


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _why_recorded(golden: Golden | None, model: str, shape: Shape, identity: Identity, accept: bool) -> str:
    if golden is None or golden.model != model:
        return "no golden yet" + (", by `sparkctl accept`" if accept else "")
    if accept:
        changes = golden.identity.changes(identity)
        return "by `sparkctl accept`" + (f"; since the old golden {_and(changes)} changed" if changes else "")
    return f"the request changed ({_shape_change(golden.shape, shape)})"


def _shape_change(was: Shape, now: Shape) -> str:
    return ", ".join(f"{k} {getattr(was, k)} → {getattr(now, k)}" for k in ("max_tokens", "seed", "top_logprobs")
                     if getattr(was, k) != getattr(now, k))
