"""The step probe's verdicts (sparkd.supervisor.steps): which rank is stuck, from every rank's last records. Tables."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.stephistory import StepHistory, StepLimits
from sparkd.supervisor.steps import NodeSteps, Pending, StepVerdict, judge_steps, probe_off, records_text, views
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

S = 1_000_000_000  # ns
READ_AT = 1000 * S  # the reading's monotonic time on its node
LIMITS = StepLimits(floor_s=5.0, margin=8.0, cap_s=300.0, schedule_s=5.0)
DECODES = StepHistory({2: 0.05, 3: 0.06})  # decode steps of a few tokens took at most 60 ms
BASE = StepRecord(role="worker", rank=0, local_rank=0, world_size=2, pid=100, pid_ns=0, start_ticks=0,
                  anchor_mono_ns=0, anchor_wall_ns=0, step=10, phase="idle", began_ns=READ_AT - 2 * S,
                  ended_ns=READ_AT - 2 * S + S // 100, tokens=3, held=-1, last_ns=S // 100, last_tokens=3,
                  longest_ns=S // 20, longest_tokens=3, host="a", boot_id="", title="", vllm="0.32.0", note="")


def rec(**changes: object) -> StepRecord:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


def inside(step: int, seconds: float, **changes: object) -> StepRecord:
    """A record inside ``step`` for ``seconds`` at the reading."""
    return rec(step=step, phase="step", began_ns=READ_AT - int(seconds * S), ended_ns=READ_AT - int(seconds * S) - 1,
               **changes)


def idle(step: int, seconds: float, **changes: object) -> StepRecord:
    """A record idle after ``step``, ended ``seconds`` before the reading."""
    return rec(step=step, phase="idle", began_ns=READ_AT - int(seconds * S) - S // 100,
               ended_ns=READ_AT - int(seconds * S), **changes)


def judge(*records: StepRecord, now: float = 500.0, history: StepHistory = DECODES,
          **kw: object) -> StepVerdict | None:
    reading = NodeSteps("a", READ_AT, records, received_at=now, states=kw.pop("states", {}))  # type: ignore[arg-type]
    return judge_steps([reading], history, now, LIMITS, **kw)  # type: ignore[arg-type]


# ---- rule 1: a rank behind the others --------------------------------------------------------------------------


def test_a_rank_inside_a_step_another_finished_is_named_with_its_step_and_how_long() -> None:
    v = judge(idle(48213, 42, rank=0, pid=10), inside(48213, 42, rank=1, pid=11, host="b"))
    assert v is not None and v.cls is FailureClass.hang
    assert v.view.record.rank == 1 and v.step == 48213 and v.seconds == pytest.approx(42)
    assert v.what.startswith("rank 1 (worker) on a, PID 11 has been inside step 48213 for 42 s")
    assert "rank 0 (worker) finished it and waits (idle for 42 s)" in v.what
    failure = v.failure()
    assert failure.cls is FailureClass.hang and failure.sentence.endswith("sparkd restarts every rank.")
    assert "rank 0 (worker) on a, PID 10: idle after step 48213" in (failure.evidence or "")


def test_the_other_rank_may_already_wait_inside_the_next_step() -> None:
    v = judge(inside(104, 6, rank=0), inside(103, 6, rank=1))
    assert v is not None and v.view.record.rank == 1 and v.step == 103
    assert "rank 0 (worker) finished it and has waited inside step 104 for 6 s" in v.what


def test_a_rank_that_never_began_the_step_the_others_wait_in() -> None:
    v = judge(idle(99, 30, rank=0, pid=7), inside(100, 6, rank=1))
    assert v is not None and v.cls is FailureClass.hang and v.view.record.pid == 7 and v.step == 100
    assert "rank 0 (worker) on a, PID 7 has not begun step 100, which rank 1 (worker) began 6 s ago" in v.what


def test_a_rank_left_behind_while_another_went_on_to_later_steps() -> None:
    v = judge(idle(99, 30, rank=0, pid=7), idle(101, 6, rank=1))
    assert v is not None and v.step == 100 and v.seconds == pytest.approx(6.01, abs=0.01)
    assert "PID 7 has not begun step 100, which rank 1 (worker) is past (it began step 101 6 s ago)" in v.what


@pytest.mark.parametrize("behind_s", [0.2, 4.9])
def test_within_the_floor_a_rank_behind_is_only_slower(behind_s: float) -> None:
    assert judge(idle(48213, behind_s, rank=0), inside(48213, behind_s, rank=1)) is None
    assert judge(idle(99, 30, rank=0), inside(100, behind_s, rank=1)) is None


def test_the_limit_follows_the_identitys_own_steps_of_that_size() -> None:
    prefill = StepHistory({2: 0.05, 14: 10.0})  # 8K-token chunks took up to 10 s: a 40 s chunk is within 8x
    assert judge(idle(5, 40, rank=0), inside(5, 40, rank=1, tokens=8192), history=prefill) is None
    assert judge(idle(5, 81, rank=0), inside(5, 81, rank=1, tokens=8192), history=prefill) is not None


def test_a_stopped_process_is_said_to_be_stopped() -> None:
    v = judge(idle(8, 9, rank=0), inside(8, 9, rank=1), states={("worker", 1): "T"})
    assert v is not None and "PID 100, stopped (SIGSTOP) has been inside step 8" in v.what


def test_of_several_ranks_behind_the_stopped_one_is_named_else_the_furthest_behind() -> None:
    """A TP=4 group with rank 3 stopped before step 3: rank 0 waits inside step 3 that ranks 1 and 2 took at once
    (behind them), rank 3 never began it (further behind, and stopped): rank 3 is why the others wait."""
    ranks = (inside(3, 6, rank=0, pid=10), idle(3, 6, rank=1, pid=11), idle(3, 6, rank=2, pid=12),
             idle(2, 7, rank=3, pid=13))
    for states in ({("worker", 3): "T"}, {}):
        v = judge(*ranks, states=states)
        assert v is not None and v.view.record.pid == 13 and v.step == 3, (states, v)
    v = judge(*ranks[:3], idle(3, 6, rank=3, pid=13), states={("worker", 0): "T"})
    assert v is not None and v.view.record.pid == 10 and "stopped (SIGSTOP) has been inside step 3" in v.what


# ---- rule 2: every rank inside one step ---------------------------------------------------------------------------


def test_every_rank_inside_one_step_past_its_limit_is_a_collective_hang() -> None:
    v = judge(inside(77, 9, rank=0, pid=1), inside(77, 8, rank=1, pid=2))
    assert v is not None and v.cls is FailureClass.hang and v.step == 77 and v.seconds == pytest.approx(8)
    assert "every rank has been inside step 77 for at least 8 s (limit 5 s) and none finished it" in v.what
    assert "a collective that does not complete" in v.what


def test_the_stopped_rank_is_named_first_in_a_collective_hang() -> None:
    v = judge(inside(77, 9, rank=0, pid=1), inside(77, 9, rank=1, pid=2), states={("worker", 1): "T"})
    assert v is not None and v.view.record.pid == 2
    assert v.what.startswith("rank 1 (worker) on a, PID 2, stopped (SIGSTOP) inside step 77; every rank")


def test_one_rank_alone_inside_a_step_is_a_stall() -> None:
    v = judge(inside(12, 6, world_size=1))
    assert v is not None and v.cls is FailureClass.stall
    assert "the only rank, has been inside step 12 for 6 s (limit 5 s)" in v.what


def test_every_rank_is_claimed_only_when_every_rank_has_a_record() -> None:
    assert judge(inside(77, 60, rank=0)) is None  # world of 2, the peer's reading missing


def test_a_long_prefill_never_seen_before_waits_for_vllms_own_timeout() -> None:
    """1M tokens in 32K chunks: a 55 s step after decode steps only is bigger than anything seen (limit: the
    decode's 60 ms scaled by 32768/4 tokens, x8 = 3932 s, capped at the execute timeout)."""
    chunk = {"tokens": 32768}
    assert judge(inside(3, 55, rank=0, **chunk), inside(3, 55, rank=1, **chunk)) is None
    assert judge(inside(3, 299, rank=0, **chunk), inside(3, 299, rank=1, **chunk)) is None
    assert judge(inside(3, 301, rank=0, **chunk), inside(3, 301, rank=1, **chunk)) is not None


def test_a_step_of_unknown_size_with_no_history_waits_for_the_cap() -> None:
    assert judge(inside(3, 200, world_size=1), history=StepHistory()) is None
    assert judge(inside(3, 301, world_size=1), history=StepHistory()) is not None


# ---- rule 3: the engine core stuck in its own step -----------------------------------------------------------------


def engine(**changes: object) -> StepRecord:
    return rec(role="engine", rank=0, local_rank=-1, pid=50, tokens=-1, last_tokens=-1, longest_tokens=-1,
               **changes)


def test_an_engine_stuck_after_its_workers_finished_the_step() -> None:
    e = dataclasses.replace(inside(332, 6), role="engine", rank=0, pid=50, tokens=-1)
    v = judge(e, idle(332, 5.9, world_size=1))
    assert v is not None and v.cls is FailureClass.hang and v.view.record.pid == 50
    assert "the engine core (engine 0) on a, PID 50 has been inside step 332 for 6 s" in v.what
    assert "its workers returned from their part of it and wait: the engine core is stuck, or the GPU work" in v.what


def test_the_sentence_names_the_tensor_parallel_group_only_where_there_is_one() -> None:
    one = judge(dataclasses.replace(inside(332, 6), role="engine", rank=0, pid=50, tokens=-1, world_size=1),
                idle(332, 5.9, world_size=1))
    assert one is not None and "tensor-parallel" not in one.failure().sentence
    assert one.failure().sentence.endswith("vLLM's one engine is wedged on that process — sparkd restarts vLLM.")
    two = judge(dataclasses.replace(inside(332, 6), role="engine", rank=0, pid=50, tokens=-1), idle(332, 5.9))
    assert two is not None and "the tensor-parallel group is wedged" in two.failure().sentence


def test_an_engine_inside_a_step_no_worker_took_names_a_stopped_worker() -> None:
    e = dataclasses.replace(inside(40, 7), role="engine", rank=0, pid=50, tokens=-1)
    worker = idle(39, 8, world_size=1, pid=60)
    v = judge(e, worker)
    assert v is not None and v.view.record.pid == 50 and "no worker began a step since" in v.what
    v = judge(e, worker, states={("worker", 0): "T"})
    assert v is not None and v.view.record.pid == 60 and v.what.startswith("rank 0 (worker) on a, PID 60, stopped")


def test_an_engine_step_within_the_floor_or_with_a_worker_inside_is_fine() -> None:
    e = dataclasses.replace(inside(40, 4), role="engine", rank=0, pid=50, tokens=-1)
    assert judge(e, idle(40, 3.9, world_size=1)) is None
    e = dataclasses.replace(inside(40, 30), role="engine", rank=0, pid=50, tokens=-1)
    assert judge(e, inside(40, 30, world_size=1, tokens=32768)) is None  # the worker computes: its limit rules


# ---- rule 4: an engine that stopped scheduling ----------------------------------------------------------------------


def test_an_engine_that_ended_a_step_holding_requests_and_begins_none() -> None:
    e = dataclasses.replace(idle(802, 6), role="engine", rank=0, pid=50, tokens=-1, held=3)
    v = judge(e, idle(802, 6, world_size=1))
    assert v is not None and v.cls is FailureClass.stall and v.step == 803
    assert "ended step 802 still holding 3 requests and has begun no step for 6 s" in v.what
    assert judge(dataclasses.replace(e, held=0), idle(802, 6, world_size=1)) is None


def test_a_waiting_request_and_no_step_begun_since() -> None:
    e = dataclasses.replace(idle(802, 20), role="engine", rank=0, pid=50, tokens=-1, held=0)
    w = idle(802, 20, world_size=1)
    v = judge(e, w, now=500.0, pending=Pending(494.0, "a test generation sent 6 s ago is unanswered"))
    assert v is not None and v.cls is FailureClass.stall
    assert v.what.startswith("a test generation sent 6 s ago is unanswered, and the engine core")
    assert judge(e, w, now=500.0, pending=Pending(496.0, "x")) is None  # waited 4 s
    began_after = dataclasses.replace(e, began_ns=READ_AT - 2 * S, ended_ns=READ_AT - S)
    assert judge(began_after, w, now=500.0, pending=Pending(494.0, "x")) is None  # a step began after it waited


# ---- what holds every rule, and the evidence ------------------------------------------------------------------------


def test_a_jit_hold_keeps_every_rule_quiet() -> None:
    assert judge(idle(8, 60, rank=0), inside(8, 60, rank=1), hold="a JIT compile") is None


def test_a_record_whose_probe_is_off_counts_as_none_and_is_reported() -> None:
    off = dataclasses.replace(inside(8, 60, rank=1), phase="off", note="cannot make its step file: ENOSPC")
    assert judge(idle(8, 60, rank=0), off) is None
    reading = NodeSteps("b", READ_AT, (off,), received_at=0.0)
    assert probe_off([reading]) == ["worker 1 on b (PID 100): cannot make its step file: ENOSPC"]


def test_a_readings_age_adds_to_every_duration_on_the_judges_clock() -> None:
    """A worker node's reading arrived 3 s ago over the peer link: its rank has been inside 3 s longer."""
    local = NodeSteps("a", READ_AT, (idle(20, 3, rank=0),), received_at=500.0)
    remote = NodeSteps("b", 77 * S, (dataclasses.replace(inside(20, 3, rank=1), began_ns=74 * S),), received_at=497.0)
    seen = {v.node: v for v in views([local, remote], 500.0)}
    assert seen["b"].inside_s == pytest.approx(6.0) and seen["a"].idle_s == pytest.approx(3.0)
    v = judge_steps([local, remote], DECODES, 500.0, LIMITS)
    assert v is not None and v.view.node == "b" and "for 6 s" in v.what


def test_the_evidence_holds_every_processs_last_record() -> None:
    text = records_text(views([NodeSteps("a", READ_AT, (engine(step=5, held=2), inside(6, 1.5)), 500.0)], 500.0))
    assert text.startswith("the engine core (engine 0) on a, PID 50: idle after step 5, ended 2.0 s ago, holding 2")
    assert "rank 0 (worker) on a, PID 100: inside step 6 for 1.5 s, 3 tokens; longest step 0.05 s" in text
    assert records_text([]) == "no step records"


def test_before_the_first_step_nothing_is_inside() -> None:
    fresh = rec(step=0, began_ns=0, ended_ns=0)
    (v,) = views([NodeSteps("a", READ_AT, (fresh,), 500.0)], 500.0)
    assert math.isinf(v.inside_s) and math.isinf(v.idle_s)
    assert judge(fresh, dataclasses.replace(fresh, rank=1)) is None
