"""The step probe in the health watch (sparkd.supervisor.stepwatch): every rank's records folded beside the health
tracker — its verdicts fail the instance once, it overrules the blind rules while the ranks step within their
limits, it learns the identity's history, says when it is off or missing, and bounds the canary's interval. Tables
on an injected clock."""

from __future__ import annotations

import dataclasses

import pytest

from sparkd.config import HealthConfig
from sparkd.supervisor import health, stall
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.health import HealthTracker, ProbeOutcome, ProbeResult
from sparkd.supervisor.readings import MetricsOff, VllmMetrics
from sparkd.supervisor.stephistory import StepHistory, StepLimits
from sparkd.supervisor.steps import NodeSteps
from sparkd.supervisor.stepwatch import (
    MISSING_AFTER_S,
    PROBE_CANARY_S,
    RESTING_AFTER_S,
    RESTING_READ_S,
    StepWatch,
    canary_every,
    canary_pending,
    limits_of,
    observe_steps,
    progressing,
    read_due,
    read_wait,
)
from sparkd.supervisor.vocabulary import HealthFailed
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

S = 1_000_000_000
CFG = HealthConfig(execute_timeout_s=1800, canary_interval_s=15, canary_timeout_s=30, busy_grace_s=600,
                   stall_after_s=45)
DECODES = StepHistory({2: 0.05, 3: 0.06, 14: 20.0})  # decode steps, and 8K-token prefill chunks of 20 s
BASE = StepRecord(role="worker", rank=0, local_rank=0, world_size=2, pid=100, pid_ns=0, start_ticks=0,
                  anchor_mono_ns=0, anchor_wall_ns=0, step=10, phase="idle", began_ns=0, ended_ns=0, tokens=3,
                  held=-1, last_ns=0, last_tokens=-1, longest_ns=S // 20, longest_tokens=3, host="a", boot_id="",
                  title="", vllm="0.32.0", note="")


def at(now: float, *records: StepRecord) -> list[NodeSteps]:
    """A reading taken at ``now`` (seconds: the node's monotonic clock is the judge's here)."""
    return [NodeSteps("a", int(now * S), records, now)]


def inside(now: float, step: int, seconds: float, **kw: object) -> StepRecord:
    began = int((now - seconds) * S)
    return dataclasses.replace(BASE, step=step, phase="step", began_ns=began, ended_ns=began - 1, **kw)  # type: ignore[arg-type]


def idle(now: float, step: int, seconds: float, **kw: object) -> StepRecord:
    ended = int((now - seconds) * S)
    fields: dict[str, object] = {"last_ns": S // 100, "last_tokens": 3, **kw}
    return dataclasses.replace(BASE, step=step, phase="idle", began_ns=ended - S // 100, ended_ns=ended,  # type: ignore[arg-type]
                               **fields)


def serving(now: float = 0.0) -> HealthTracker:
    t, _ = health.observe_health(HealthTracker(topology=health.Topology.local), ProbeResult(ProbeOutcome.ok, 0.01),
                                 now, CFG)
    assert t.watching
    return t


def test_a_verdict_fails_the_instance_once_naming_the_rank() -> None:
    w, t = StepWatch(history=DECODES), serving()
    w, t, obs = observe_steps(w, t, at(100, idle(100, 48213, 42, rank=0, pid=10),
                                       inside(100, 48213, 42, rank=1, pid=11)), 100, CFG)
    assert isinstance(obs, HealthFailed) and obs.failure.cls is FailureClass.hang
    assert obs.failure.sentence.startswith("rank 1 (worker) on a, PID 11 has been inside step 48213 for 42 s")
    assert "rank 0 (worker) on a, PID 10: idle after step 48213" in (obs.failure.evidence or "")
    assert w.verdict is not None and w.verdict.view.record.pid == 11
    assert t.verdict is health.Verdict.failed and t.failure is obs.failure
    _, _, again = observe_steps(w, t, at(101, idle(101, 48213, 43, rank=0), inside(101, 48213, 43, rank=1)), 101,
                                CFG)
    assert again is None, "the tracker is on hold: one verdict per instance"


def test_nothing_is_judged_before_vllm_serves() -> None:
    w, t, obs = observe_steps(StepWatch(history=DECODES), HealthTracker(),
                              at(100, idle(100, 9, 42, rank=0), inside(100, 9, 42, rank=1)), 100, CFG)
    assert obs is None and t.verdict is health.Verdict.starting and w.serving_since is None


def test_a_jit_compile_the_wedge_clock_holds_for_holds_the_probe_too() -> None:
    t = serving()
    t = dataclasses.replace(t, clock=stall.on_line(t.clock, stall.JitCompile("Triton kernel JIT compilation"), 50))
    _, _, obs = observe_steps(StepWatch(history=DECODES), t,
                              at(100, inside(100, 9, 42, rank=0), inside(100, 9, 42, rank=1)), 100, CFG)
    assert obs is None


def test_an_engine_that_begins_no_step_for_sparkds_canary_stopped_scheduling() -> None:
    engine = idle(100, 500, 30, role="engine", tokens=-1, held=0)
    readings = at(100, engine, idle(100, 500, 30, rank=0), idle(100, 500, 30, rank=1))
    _, _, quiet = observe_steps(StepWatch(history=DECODES), serving(), readings, 100, CFG)
    assert quiet is None, "an idle engine with no request is idle"
    _, _, obs = observe_steps(StepWatch(history=DECODES), serving(), readings, 100, CFG,
                              pending=canary_pending(94.0))
    assert isinstance(obs, HealthFailed) and obs.failure.cls is FailureClass.stall
    assert "a test generation sparkd sent is unanswered" in obs.failure.sentence
    assert "has begun no step for 6 s" in obs.failure.sentence


# ---- the blind rules overruled ---------------------------------------------------------------------------------


def blind_canary_out(since: float) -> HealthTracker:
    """--disable-log-stats (no step observable) and a canary unanswered since ``since``."""
    t = serving(0.0)
    t, _ = health.observe_metrics(t, MetricsOff(), 1.0, CFG)
    t, _ = health.observe_canary(t, ProbeResult(ProbeOutcome.timeout, CFG.canary_timeout_s, "timeout"), since, CFG)
    return t


def test_a_long_prefill_the_probe_sees_stepping_is_no_busy_grace_hang() -> None:
    now = 700.0
    t = blind_canary_out(60.0)
    chunk = inside(now, 30, 12, tokens=8192)  # an 8K chunk for 12 s: its size took 20 s before
    _, t, obs = observe_steps(StepWatch(history=DECODES), t, at(now, chunk, dataclasses.replace(chunk, rank=1)),
                              now, CFG)
    assert obs is None and stall.vouched(t.clock, now)
    timeout = ProbeResult(ProbeOutcome.timeout, CFG.canary_timeout_s, "timeout")
    _, vetoed = health.observe_canary(t, timeout, now + 1, CFG)
    assert not isinstance(vetoed, HealthFailed)
    _, fired = health.observe_canary(t, timeout, now + 1 + stall.VOUCH_S + 0.5, CFG)
    assert isinstance(fired, HealthFailed) and "busy grace" in fired.failure.sentence, "without the probe's word: "


def test_the_executors_wait_line_is_overruled_while_the_ranks_step_within_their_limits() -> None:
    t = blind_canary_out(10.0)
    line = stall.ShmWait(60)
    clock = stall.on_line(t.clock, line, 70.0)
    assert stall.judge(clock, 70.0, CFG) is not None, "the blind rule alone calls a hang"
    clock = stall.on_probe(clock, 69.5)
    assert stall.judge(clock, 70.0, CFG) is None
    assert stall.judge(clock, 69.5 + stall.VOUCH_S + 0.1, CFG) is not None


@pytest.mark.parametrize(("records", "history", "why"), [
    ((inside(100, 30, 12, tokens=8192),), StepHistory(), "nothing seen yet: no yardstick"),
    ((inside(100, 30, 12, tokens=-1),), DECODES, "a step of unknown size has no yardstick"),
    ((inside(100, 30, 170, tokens=8192),), DECODES, "past its limit (8 x 20 s)"),
    ((idle(100, 30, 9),), DECODES, "idle for longer than the floor"),
    ((dataclasses.replace(inside(100, 30, 1, tokens=3), phase="off"),), DECODES, "a probe that turned itself off"),
    ((), DECODES, "no records"),
])
def test_the_probe_vouches_only_for_steps_its_history_backs(records: tuple[StepRecord, ...], history: StepHistory,
                                                             why: str) -> None:
    assert not progressing(at(100, *records), history, 100, StepLimits()), why


def test_the_probe_vouches_for_a_step_within_its_limit_and_for_one_just_ended() -> None:
    assert progressing(at(100, inside(100, 30, 12, tokens=8192)), DECODES, 100, StepLimits())
    assert progressing(at(100, idle(100, 30, 0.5)), DECODES, 100, StepLimits())


# ---- the history, the warning, the canary ----------------------------------------------------------------------


def test_every_reading_teaches_the_identitys_history() -> None:
    record = idle(100, 30, 0.5, last_ns=3 * S, last_tokens=8192, longest_ns=4 * S, longest_tokens=9000)
    w, _, _ = observe_steps(StepWatch(), serving(), at(100, record), 100, CFG)
    assert w.history.longest == {14: 4.0} and w.history.learned == 2


def test_no_step_file_after_vllm_served_is_one_warning() -> None:
    w, t = StepWatch(), serving()
    w, t, _ = observe_steps(w, t, at(100), 100, CFG)
    assert w.warning is None
    w, t, obs = observe_steps(w, t, at(100 + MISSING_AFTER_S), 100 + MISSING_AFTER_S, CFG)
    assert obs is None and w.warning is not None and w.warning.startswith("no step file 10 s after vLLM served")
    assert "supervised without it" in w.warning
    w, _, _ = observe_steps(w, t, at(120, idle(120, 3, 1)), 120, CFG)
    assert w.warning is None and w.seen


def test_a_probe_that_turned_itself_off_is_the_warning() -> None:
    off = dataclasses.replace(BASE, phase="off", note="hooking execute_model failed: AttributeError")
    w, _, obs = observe_steps(StepWatch(), serving(), at(100, off), 100, CFG)
    assert obs is None and w.warning is not None
    assert "turned itself off" in w.warning and "worker 0 on a (PID 100): hooking execute_model failed" in w.warning


def test_the_canary_runs_at_least_every_8_s_while_the_probe_reads_the_ranks() -> None:
    assert canary_every(StepWatch(), 15.0) == 15.0
    seen = StepWatch(seen=True)
    assert canary_every(seen, 15.0) == PROBE_CANARY_S and canary_every(seen, 3.0) == 3.0


def test_the_limits_are_capped_at_vllms_execute_timeout() -> None:
    assert limits_of(CFG).cap_s == 1800 and limits_of(HealthConfig()).cap_s == stall.VLLM_DEFAULT_EXECUTE_TIMEOUT_S


def test_iteration_tokens_counted_is_a_heartbeat_from_the_api_side() -> None:
    """A prefill's chunks move no token counter, but each step with outputs adds to vllm:iteration_tokens_total."""
    def scrape(steps: float) -> VllmMetrics:
        return VllmMetrics(num_requests_running=1, generation_tokens_total=100, num_requests_waiting=0,
                           prompt_tokens_total=800, kv_cache_usage_perc=0.5, engine_steps_total=steps)

    clock = stall.on_metrics(stall.StallClock(), scrape(10), 0.0)
    clock = stall.on_metrics(clock, scrape(10), 5.0)
    assert clock.progress_at is None
    clock = stall.on_metrics(clock, scrape(11), 10.0)
    assert clock.progress_at == 10.0


WAITING = canary_pending(95.0)


@pytest.mark.parametrize(("nodes", "seen", "pending", "since_read", "due"), [
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), True, None, 1.0, False),  # every rank rests: not every second
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), True, None, RESTING_READ_S, True),  # ... but every RESTING_READ_S
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), True, WAITING, 1.0, True),  # a canary waits: a step is due
    (at(100, inside(100, 10, 0.5)), True, None, 1.0, True),  # a rank steps
    (at(100, idle(100, 9, 2.0)), True, None, 1.0, True),  # it ended a step a moment ago
    (at(100, idle(100, 9, RESTING_AFTER_S + 1, role="engine", held=2)), True, None, 1.0, True),  # requests held
    (at(100, idle(100, 9, RESTING_AFTER_S + 1), inside(100, 10, 0.5, rank=1)), True, None, 1.0, True),  # one steps
    ([], False, None, 1.0, True),  # nothing read yet: the missing plugin's warning waits on the readings
    (at(100, dataclasses.replace(BASE, phase="off", note="x")), True, None, 1.0, False),  # the probe is off
])
def test_the_files_are_read_every_second_unless_every_rank_rests(nodes: list[NodeSteps], seen: bool,
                                                                 pending: object, since_read: float, due: bool) -> None:
    w = StepWatch(nodes=tuple(nodes), seen=seen)
    assert read_due(w, 100.0, 100.0 - since_read, pending) is due  # type: ignore[arg-type]
    assert read_due(w, 100.0, None, None)  # the first reading always


def test_a_rest_is_measured_on_the_judges_clock_as_the_reading_ages() -> None:
    """A reading taken while a rank had just ended a step ages into a rest without a new reading."""
    w = StepWatch(nodes=tuple(at(100, idle(100, 9, 1.0))), seen=True)
    assert read_due(w, 101.0, 100.0, None)
    assert not read_due(w, 100.0 + RESTING_AFTER_S, 100.0 + RESTING_AFTER_S - 1, None)


@pytest.mark.parametrize(("nodes", "pending", "since_read", "wait"), [
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), None, 0.0, RESTING_READ_S),  # at rest: until the resting read
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), None, 2.0, RESTING_READ_S - 2.0),
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), None, RESTING_READ_S, 1.0),  # overdue: the next second
    (at(100, idle(100, 9, RESTING_AFTER_S + 1)), WAITING, 0.0, 1.0),  # a canary waits: every second
    (at(100, inside(100, 10, 0.5)), None, 0.0, 1.0),  # a rank steps
    (at(100, idle(100, 9, 1.0)), None, 0.0, 1.0),  # it ended a step a moment ago: not resting yet
])
def test_at_rest_the_watch_sleeps_until_the_resting_read(nodes: list[NodeSteps], pending: object,
                                                         since_read: float, wait: float) -> None:
    """Issue 35: no wake-up a second that would only find nothing due; a canary sent wakes the shell (the watch's
    own test, test_watch_verdicts.py)."""
    w = StepWatch(nodes=tuple(nodes), seen=True)
    assert read_wait(w, 100.0, 100.0 - since_read, pending) == pytest.approx(wait)  # type: ignore[arg-type]
    assert read_wait(w, 100.0, None, None) == 1.0  # nothing read yet
