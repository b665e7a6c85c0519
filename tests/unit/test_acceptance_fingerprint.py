"""The answer fingerprint (sparkd/supervisor/acceptance/fingerprint.py): recorded on the first pass, exact under the
same identity, close agreement after a change, and a sentence that names the prompt, the first differing token and
what changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkd.supervisor.acceptance.answers import Answer, Golden, Identity, Shape
from sparkd.supervisor.acceptance.fingerprint import (
    FingerprintResult,
    Outcome,
    Rules,
    common_prefix,
    compare,
    near_tie,
)

SHAPE = Shape(max_tokens=8, seed=1234, top_logprobs=3)
ID = Identity("sha256:" + "a" * 64, "sha256:" + "b" * 64, "c" * 16)
RULES = Rules(prefix_tokens=4, tie_margin=0.5, min_similarity=0.5)
WORDS = [" Paris", " is", " the", " capital", " of", " France", ".", " It"]


def answer(ids: list[int], prompt: str = "capital", api: str = "chat", *, words: list[str] | None = None,
           margin: float = 2.0, alt: str = " Lyon") -> Answer:
    tokens = tuple((words or WORDS)[: len(ids)])
    top = tuple(((t, -0.1), (alt, -0.1 - margin), (" x", -5.0)) for t in tokens)
    return Answer(prompt, api, tuple(ids), "".join(tokens), "length", tokens, top)


GOLD = [answer([1, 2, 3, 4, 5, 6, 7, 8]), answer([1, 2, 3, 4, 5, 6, 7, 8], api="completion")]


def golden(answers: list[Answer] = GOLD, identity: Identity = ID) -> Golden:
    return Golden(identity, SHAPE, {a.key: a for a in answers}, None, 1000.0, "m")


def run(now: list[Answer], identity: Identity = ID, gold: Golden | None = None) -> FingerprintResult:
    return compare(golden() if gold is None else gold, now, identity, SHAPE, RULES, model="m", now_wall=2000.0)


def test_the_first_pass_records_the_golden() -> None:
    result = compare(None, GOLD, ID, SHAPE, RULES, model="m", now_wall=5.0)
    assert result.outcome is Outcome.recorded and result.ok
    assert result.golden is not None and set(result.golden.answers) == {"capital/chat", "capital/completion"}
    assert result.golden.identity == ID and result.golden.recorded_at == 5.0
    assert "recorded as the golden (no golden yet)" in result.sentence


def test_same_identity_same_tokens_match_exactly() -> None:
    result = run(GOLD)
    assert result.outcome is Outcome.matched and result.exact and result.golden is None  # nothing to write
    assert result.sentence == "2 answers match the golden exactly."


def test_same_identity_one_token_differs_is_a_change_even_at_a_tie() -> None:
    tied = answer([1, 2, 3, 4, 5, 6, 9, 8], words=[*WORDS[:6], " Lyon", " It"], margin=0.01)
    result = run([tied, GOLD[1]])
    assert result.outcome is Outcome.changed and not result.ok
    assert result.sentence == (
        "The answer to prompt 'capital' (chat) differs from the golden at token 6: '.' (id 7) became ' Lyon' (id 9); "
        "nothing in the identity changed since the golden (same image, weights and launch): the engine computes "
        "differently (a kernel, the GPU, its memory).")


def test_after_a_change_a_difference_past_the_prefix_is_tolerated() -> None:
    late = answer([1, 2, 3, 4, 5, 99, 98, 97], words=[*WORDS[:5], " A", " B", " C"])
    result = run([late, GOLD[1]], identity=replace(ID, image="sha256:" + "d" * 64))
    assert result.outcome is Outcome.matched and not result.exact
    assert result.similarity == pytest.approx((5 + 8) / 16)
    assert "closely after the image aaaaaaaaaaaa → dddddddddddd changed; 1 part from it" in result.sentence


def test_after_a_change_an_early_difference_at_a_near_tie_is_numerics() -> None:
    # the golden itself held " Lyon" within 0.3 nats of " is" at token 1
    gold = golden([answer([1, 2, 3, 4, 5, 6, 7, 8], margin=0.3), GOLD[1]])
    flipped = answer([1, 9, 3, 4, 5, 6, 7, 8], words=[" Paris", " Lyon", *WORDS[2:]])
    result = run([flipped, GOLD[1]], identity=replace(ID, launch="e" * 16), gold=gold)
    assert result.outcome is Outcome.matched, result.sentence
    assert result.differences[0].near_tie


def test_after_a_change_an_early_difference_the_golden_never_considered_is_a_change() -> None:
    other = answer([1, 77, 78, 79, 80, 81, 82, 83], words=[" Paris", " zebra", " a", " b", " c", " d", " e", " f"])
    result = run([other, GOLD[1]], identity=replace(ID, weights="sha256:" + "f" * 64))
    assert result.outcome is Outcome.changed
    assert result.sentence == (
        "The answer to prompt 'capital' (chat) differs from the golden at token 1: ' is' (id 2) became ' zebra' "
        "(id 77); since the golden, the weights (the model directory's manifest) bbbbbbbbbbbb → ffffffffffff changed.")


def test_after_a_change_too_little_agreement_overall_is_a_change() -> None:
    gold = golden([answer([1, 2, 3, 4, 5, 6, 7, 8], p, margin=0.1) for p in ("a", "b")])
    # both part at a near tie at token 0: each allowed, but nothing agrees any more
    flipped = [answer([9, 2, 3, 4, 5, 6, 7, 8], p, words=[" Lyon", *WORDS[1:]]) for p in ("a", "b")]
    result = run(flipped, identity=replace(ID, launch="e" * 16), gold=gold)
    assert result.outcome is Outcome.changed and result.similarity == 0.0
    assert result.sentence.startswith("After the launch's flags or environment " + "c" * 16 + " → " + "e" * 16
                                      + " changed since the golden, only 0% of the answer tokens agree with it")


def test_an_answer_that_ends_early_differs_at_its_end() -> None:
    short = answer([1, 2, 3])
    result = run([short, GOLD[1]])
    assert result.outcome is Outcome.changed
    assert "at token 3: ' capital' (id 4) became the end of the answer" in result.sentence


def test_a_new_prompt_is_recorded_beside_the_golden() -> None:
    extra = answer([5, 6], prompt="code")
    result = run([*GOLD, extra])
    assert result.outcome is Outcome.matched and result.recorded == ("code/chat",)
    assert result.golden is not None and "code/chat" in result.golden.answers
    assert result.sentence == "2 answers match the golden exactly; 1 new (code/chat) recorded."


def test_another_request_shape_records_anew_and_says_what_changed() -> None:
    result = compare(golden(), GOLD, ID, replace(SHAPE, max_tokens=64), RULES, model="m", now_wall=1.0)
    assert result.outcome is Outcome.recorded
    assert "(the request changed (max_tokens 8 → 64))" in result.sentence


def test_another_model_has_no_golden_yet() -> None:
    result = compare(golden(), GOLD, ID, SHAPE, RULES, model="other", now_wall=1.0)
    assert result.outcome is Outcome.recorded and result.golden is not None and result.golden.model == "other"


def test_accept_records_whatever_the_golden_held_and_says_what_changed() -> None:
    other = answer([1, 77, 78, 79, 80, 81, 82, 83])
    result = compare(golden(), [other], replace(ID, weights="sha256:" + "f" * 64), SHAPE, RULES, model="m",
                     now_wall=9.0, accept=True)
    assert result.outcome is Outcome.recorded and result.golden is not None
    assert result.golden.answers["capital/chat"].token_ids[1] == 77
    assert "by `sparkctl accept`; since the old golden the weights" in result.sentence


@pytest.mark.parametrize(("a", "b", "n"), [([], [], 0), ([1, 2], [1, 2, 3], 2), ([1, 2], [2, 1], 0)])
def test_common_prefix(a: list[int], b: list[int], n: int) -> None:
    assert common_prefix(a, b) == n


def test_a_near_tie_is_read_from_either_side() -> None:
    gold = answer([1, 2], margin=2.0)  # the golden saw " Lyon" 2 nats behind
    now = answer([1, 9], words=[" Paris", " Lyon"], margin=0.2, alt=" is")  # the new answer saw " is" 0.2 behind
    assert near_tie(gold, now, 1, 0.5)
    assert not near_tie(gold, answer([1, 9], words=[" Paris", " Lyon"], margin=2.0, alt=" is"), 1, 0.5)


def test_the_golden_round_trips_through_json() -> None:
    gold = golden()
    assert Golden.from_json(gold.to_json()) == gold
