"""The gate composed (sparkd/supervisor/acceptance/gate.py) and run (sparkd/acceptance/runner.py) with a fake vLLM:
the parts planned from the config and the launch, the gravest verdict first with its sentence, the policy, the
golden kept only when no answer is wrong, progress, and the budget."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest

from sparkd.acceptance.client import AskFailed
from sparkd.acceptance.runner import GateFacts, run_gate
from sparkd.config.acceptance import AcceptanceConfig
from sparkd.state.golden import GoldenStore, golden_path
from sparkd.supervisor.acceptance.answers import Answer, Capacity, Identity, Shape
from sparkd.supervisor.acceptance.gate import GateResult, Part, PartResult, Progress, Verdict, decide, plan
from sparkd.supervisor.failures import FailureClass, treatment
from sparkd.testing import FakeClock

ID = Identity("img", "sha256:" + "1" * 64, "launch")


@pytest.mark.parametrize(("kw", "parts"), [
    ({}, (Part.capacity, Part.fingerprint, Part.garble)),
    ({"speculative": True}, (Part.capacity, Part.fingerprint, Part.garble, Part.spec_decode)),
    ({"nans_in_logits": True, "garble_levels": []}, (Part.capacity, Part.fingerprint, Part.numerics)),
    ({"speculative": True, "spec_decode": False, "capacity": False}, (Part.fingerprint, Part.garble)),
])
def test_the_plan_follows_the_config_and_the_launch(kw: dict[str, object], parts: tuple[Part, ...]) -> None:
    args: dict[str, object] = {"capacity": True, "fingerprint": True, "garble_levels": [1, 2], "spec_decode": True,
                               "numerics": True, "speculative": False, "nans_in_logits": False, **kw}
    assert plan(**args) == parts  # type: ignore[arg-type]


def part(p: Part, ok: bool | None, sentence: str = "x") -> PartResult:
    return PartResult(p, ok, sentence)


def test_the_gravest_part_is_the_verdict_and_the_others_are_said_after_it() -> None:
    result = decide([part(Part.capacity, False, "capacity lost 5%."), part(Part.fingerprint, False, "prompt differs."),
                     part(Part.garble, True)], started_at=10.0, now=14.5)
    assert result.verdict is Verdict.answers_changed and result.refuse and result.seconds == 4.5
    assert result.failure is not None and result.failure.cls is FailureClass.answers_changed
    assert result.sentence == ("Prompt differs — sparkd keeps it from ready and does not restart it: find what "
                               "changed, or run `sparkctl accept` if the change was intended. Also capacity: "
                               "capacity lost 5%.")


@pytest.mark.parametrize(("failing", "verdict", "cls", "refuse"), [
    (Part.numerics, Verdict.corrupted, FailureClass.answers_garbled, True),
    (Part.garble, Verdict.garbled, FailureClass.answers_garbled, True),
    (Part.fingerprint, Verdict.answers_changed, FailureClass.answers_changed, True),
    (Part.capacity, Verdict.capacity_lost, FailureClass.capacity_lost, False),
    (Part.spec_decode, Verdict.spec_decode_inactive, FailureClass.capacity_lost, False),
])
def test_each_verdict_its_class_and_the_default_policy(failing: Part, verdict: Verdict, cls: FailureClass,
                                                       refuse: bool) -> None:
    result = decide([part(failing, False)], started_at=0, now=1)
    assert (result.verdict, result.refuse) == (verdict, refuse)
    assert result.failure is not None and result.failure.cls is cls
    assert not treatment(cls).restartable, "a changed answer is never a restart loop"
    if not refuse:
        assert "vLLM serves anyway" in result.sentence


def test_the_policy_can_be_turned_around() -> None:
    assert not decide([part(Part.garble, False)], started_at=0, now=1, on_wrong_answers="warn").refuse
    assert decide([part(Part.capacity, False)], started_at=0, now=1, on_lost_performance="refuse").refuse


def test_all_passed_or_unjudged_is_a_pass_and_an_unfinished_part_is_incomplete_never_refused() -> None:
    passed = decide([part(Part.capacity, None), part(Part.fingerprint, True)], started_at=0, now=2)
    assert passed.verdict is Verdict.passed and passed.failure is None
    assert passed.sentence == "The acceptance gate passed in 2.0 s (fingerprint)."
    unfinished = decide([PartResult(Part.fingerprint, None, "no answer in 5 s", incomplete=True)], started_at=0, now=2)
    assert unfinished.verdict is Verdict.incomplete and not unfinished.refuse


def test_progress_says_the_part_running_and_the_time() -> None:
    state = Progress(100.0, (Part.capacity, Part.fingerprint))
    assert state.line(103.0) == "capacity, 1 of 2 parts, 3 s"
    state = state.after(part(Part.capacity, True))
    assert (state.current, state.line(110.0)) == (Part.fingerprint, "fingerprint, 2 of 2 parts, 10 s")
    assert state.after(part(Part.fingerprint, True)).line(111.0) == "deciding, 2 of 2 parts, 11 s"


# ---- the runner, with a fake vLLM --------------------------------------------------------------------------------

SPEC_PAGE = ('vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}\n'
             'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {a}\n'
             'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {b}\n')


class FakeVllm:
    """Answers by prompt; ``mode`` changes what it says; each request advances the clock a little."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.mode, self.asked, self.drafts, self.stuck = clock, "normal", 0, 0, False

    async def ask(self, prompt_name: str, prompt: str, api: str, shape: Shape,
                  chat_template_kwargs: Mapping[str, object] | None = None) -> Answer:
        self.asked += 1
        self.clock.advance(0.5)
        self.drafts += 1
        if self.mode == "down":
            raise AskFailed(f"prompt {prompt_name!r} ({api}) got no answer in 5 s")
        words = {"normal": [" Paris", " is", " lovely", "."], "changed": [" Rome", " is", " old", "."],
                 "loop": [" is"] * 40}[self.mode]
        ids = tuple(hash(w) % 1000 for w in words)
        top = tuple(((w, -0.1), (" x", -3.0)) for w in words)
        return Answer(prompt_name, api, ids, "".join(words), "stop", tuple(words), top)

    async def metrics(self) -> str:
        return SPEC_PAGE.format(d=self.drafts, a=self.drafts, b=0 if self.stuck else self.drafts)


def cfg(**kw: object) -> AcceptanceConfig:
    return AcceptanceConfig(garble_levels=[1, 2], **kw)  # type: ignore[arg-type]


def gate(tmp_path: Path, vllm: FakeVllm, clock: FakeClock, facts: GateFacts | None = None, *,
         config: AcceptanceConfig | None = None, seen: list[str] | None = None, accept: bool = False) -> GateResult:
    facts = facts or GateFacts("m", ID, Capacity(1000, 2.0, 500))
    return anyio.run(lambda: run_gate(config or cfg(), facts, vllm, GoldenStore(tmp_path), clock=clock.now,
                                      wall=clock.wall, accept=accept,
                                      progress=lambda p: seen.append(p.line(clock.now()))
                                      if seen is not None else None))


def test_a_first_pass_records_the_golden_and_the_next_matches(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    seen: list[str] = []
    first = gate(tmp_path, vllm, clock, seen=seen)
    assert first.verdict is Verdict.passed, first.sentence
    assert vllm.asked == 6 + 3 and golden_path(tmp_path, "m").is_file()  # 3 prompts x 2 APIs, levels 1 and 2
    assert seen[0] == "capacity, 1 of 3 parts, 0 s" and seen[-1].startswith("deciding, 3 of 3 parts")
    second = gate(tmp_path, vllm, clock)
    fingerprint = second.parts[1]
    assert second.verdict is Verdict.passed and fingerprint.sentence == "6 answers match the golden exactly."


def test_changed_answers_are_refused_with_the_weights_named_and_the_golden_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    gate(tmp_path, vllm, clock)
    kept = golden_path(tmp_path, "m").read_bytes()
    vllm.mode = "changed"
    other = GateFacts("m", Identity("img", "sha256:" + "2" * 64, "launch"), Capacity(1000, 2.0, 500))
    result = gate(tmp_path, vllm, clock, other)
    assert result.verdict is Verdict.answers_changed and result.refuse
    assert "since the golden, the weights (the model directory's manifest) 111111111111 → 222222222222 changed" \
        in result.sentence
    assert golden_path(tmp_path, "m").read_bytes() == kept, "a refused answer never becomes the golden"
    assert result.parts[1].facts["first_difference"] == {"answer": "capital/chat", "token": 0,
                                                         "golden": " Paris is lovely.", "now": " Rome is old."}
    accepted = gate(tmp_path, vllm, clock, other, accept=True)
    assert accepted.verdict is Verdict.passed, accepted.sentence
    assert gate(tmp_path, vllm, clock, other).verdict is Verdict.passed


def test_a_garbled_first_pass_records_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    vllm.mode = "loop"
    result = gate(tmp_path, vllm, clock)
    assert result.verdict is Verdict.garbled and result.refuse
    assert "6 of 3 answers" not in result.sentence and "loop" in result.sentence
    assert not golden_path(tmp_path, "m").exists()


def test_a_speculative_decoder_that_stops_accepting_is_said_and_served(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    vllm.stuck = True
    facts = GateFacts("m", ID, Capacity(1000, 2.0, 500), speculative=True, speculative_positions=2)
    result = gate(tmp_path, vllm, clock, facts)
    assert result.verdict is Verdict.spec_decode_inactive and not result.refuse
    assert result.sentence.startswith("1 of 2 draft positions accepted no token during the gate (position 1")
    assert golden_path(tmp_path, "m").is_file(), "answers that are right are kept"


def test_no_answer_is_incomplete_not_a_refusal(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    vllm.mode = "down"
    result = gate(tmp_path, vllm, clock)
    assert result.verdict is Verdict.incomplete and not result.refuse
    assert "got no answer in 5 s" in result.sentence


def test_the_budget_ends_the_gate_and_says_which_parts_never_ran(tmp_path: Path) -> None:
    clock = FakeClock()

    class Slow(FakeVllm):
        async def ask(self, *args: object, **kw: object) -> Answer:
            await anyio.sleep(5)
            raise AssertionError("the budget should have ended this")

    result = gate(tmp_path, Slow(clock), clock, config=cfg(timeout_s=0.2))
    assert result.verdict is Verdict.incomplete
    assert [p.part for p in result.parts] == [Part.capacity, Part.fingerprint, Part.garble]
    assert "the gate's budget of 0.2 s ran out before it" in result.sentence


def test_capacity_is_judged_against_the_golden_recorded_with_it(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    gate(tmp_path, vllm, clock)
    smaller = GateFacts("m", ID, Capacity(900, 1.8, 500))
    result = gate(tmp_path, vllm, clock, smaller)
    assert result.verdict is Verdict.capacity_lost and not result.refuse
    assert result.sentence.startswith("vLLM's KV cache holds 900 tokens")
    assert "100 (10.0%) fewer than the golden's 1,000" in result.sentence


def test_a_replay_asks_only_the_fingerprint_and_the_numerics(tmp_path: Path) -> None:
    clock = FakeClock()
    vllm = FakeVllm(clock)
    facts = GateFacts("m", ID, Capacity(1000, 2.0, 500), speculative=True, speculative_positions=2)
    gate(tmp_path, vllm, clock, facts)
    asked = vllm.asked
    result = anyio.run(lambda: run_gate(cfg(), facts, vllm, GoldenStore(tmp_path), clock=clock.now, wall=clock.wall,
                                        replay=True))
    assert [p.part for p in result.parts] == [Part.fingerprint] and result.verdict is Verdict.passed
    assert vllm.asked - asked == 6
