"""The lifecycle table: (state, observation, time) → (state, actions, edge). Pure, no clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkd.supervisor import lifecycle
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.policy import RestartPolicy, RestartState
from sparkd.supervisor.states import (
    After,
    Intent,
    Limits,
    Machine,
    Remembered,
    State,
    quiescent,
    refusal,
    remembered,
    restore,
)
from sparkd.supervisor.timing import LaunchTiming

LIMITS = Limits(
    startup_timeout_s=100.0,
    startup_silence_s=30.0,
    startup_extension_s=5.0,
    restart=RestartPolicy(
        backoff_initial_s=10.0, jitter=0.0, budget_failures=3, budget_window_s=1000.0, consecutive_limit=None
    ),
)


def failure(cls: FailureClass = FailureClass.engine_dead) -> Failure:
    return Failure.of(cls, f"{cls} happened", exit_code=1)


CRASH = failure()
RUNNING_INSTANCE = Instance(runtime="process", pid=4000, create_time=1.0, config_hash="h")
CONFIG = failure(FailureClass.config_error)
FAILED = dict(breaker_reason="3 failures in 30 min")


def at(state: State, **kw) -> Machine:
    return replace(Machine(), state=state, **kw)


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def step(m: Machine, obs: v.Observation, now: float, limits: Limits = LIMITS) -> Machine:
    return lifecycle.step(m, obs, now, limits).machine


# (name, machine, observation, now, expected state, expected action kinds)
TABLE = [
    ("boot finds nothing → preflight", at(State.adopting), v.Adopted(None), 0, State.preflight, ["RunPreflight"]),
    ("boot finds nothing, stop remembered", at(State.adopting, intent=Intent.stop), v.Adopted(None), 0,
     State.stopped, []),
    ("boot finds nothing, breaker remembered", at(State.adopting, **FAILED), v.Adopted(None), 0, State.failed, []),
    ("boot finds nothing, backoff remembered", at(State.adopting, deadline=50.0), v.Adopted(None), 10,
     State.backoff, []),
    ("boot finds nothing, backoff over while down", at(State.adopting, deadline=5.0), v.Adopted(None), 10,
     State.preflight, ["RunPreflight"]),
    ("boot adopts a running instance → starting, no launch", at(State.adopting), v.Adopted(RUNNING_INSTANCE), 0,
     State.starting, []),
    ("boot adopts an instance the operator stopped → stop it", at(State.adopting, intent=Intent.stop),
     v.Adopted(RUNNING_INSTANCE), 0, State.stopping, ["Stop"]),
    ("preflight ok → launch", at(State.preflight), v.PreflightDone(), 1, State.starting, ["Launch"]),
    ("preflight fails → incident + backoff", at(State.preflight), v.PreflightDone(CRASH), 1, State.backoff,
     ["RecordIncident"]),
    ("preflight config error → failed at once", at(State.preflight), v.PreflightDone(CONFIG), 1, State.failed,
     ["RecordIncident"]),
    ("ready from starting", at(State.starting, started_at=0), v.BecameReady(), 5, State.ready, []),
    ("progress keeps starting", at(State.starting, started_at=0), v.Progress(), 5, State.starting, []),
    ("exit during start → stop (sweep) with incident", at(State.starting, started_at=0), v.Exited(CRASH), 5,
     State.stopping, ["RecordIncident", "Stop"]),
    ("launch failed → stop with incident", at(State.starting), v.LaunchFailed(CONFIG), 5, State.stopping,
     ["RecordIncident", "Stop"]),
    ("silent start past the silence limit → stop", at(State.starting, started_at=0, last_progress_at=10),
     v.Tick(), 41, State.stopping, ["RecordIncident", "Stop"]),
    ("start within silence limit → keep waiting", at(State.starting, started_at=0, last_progress_at=10),
     v.Tick(), 39, State.starting, []),
    ("past the budget but progressing → the budget is extended",
     at(State.starting, started_at=0, last_progress_at=99), v.Tick(), 100, State.starting, []),
    ("past the budget and no progress for the extension → stop",
     at(State.starting, started_at=0, last_progress_at=90), v.Tick(), 100, State.stopping,
     ["RecordIncident", "Stop"]),
    ("ready degrades", at(State.ready), v.HealthDegraded("1 probe failed"), 5, State.degraded, []),
    ("degraded recovers", at(State.degraded), v.HealthRecovered(), 5, State.ready, []),
    ("health fails → stop", at(State.degraded), v.HealthFailed(failure(FailureClass.stall)), 5, State.stopping,
     ["RecordIncident", "Stop"]),
    ("a guard stop already recorded still records (counted), with its grace",
     at(State.ready), v.HealthFailed(failure(FailureClass.killed_by_guard), grace_s=7.0, recorded=True), 5,
     State.stopping, ["RecordIncident", "Stop"]),
    ("an exit while ready is a failure", at(State.ready), v.Exited(CRASH), 5, State.stopping,
     ["RecordIncident", "Stop"]),
    ("stop done after a failure → backoff", at(State.stopping, answering=CRASH, after=After.recover),
     v.StopDone(), 5, State.backoff, []),
    ("stop done after a config error → failed", at(State.stopping, answering=CONFIG, after=After.recover),
     v.StopDone(), 5, State.failed, []),
    ("stop done after a failure, operator said stop meanwhile → stopped",
     at(State.stopping, answering=CRASH, after=After.recover, intent=Intent.stop), v.StopDone(), 5,
     State.stopped, []),
    ("stop done after operator stop → stopped", at(State.stopping, after=After.stay, intent=Intent.stop),
     v.StopDone(), 5, State.stopped, []),
    ("stop done after operator restart → preflight", at(State.stopping, after=After.restart), v.StopDone(), 5,
     State.preflight, ["RunPreflight"]),
    ("backoff not elapsed", at(State.backoff, deadline=10), v.Tick(), 9, State.backoff, []),
    ("backoff elapsed → preflight", at(State.backoff, deadline=10), v.Tick(), 10, State.preflight,
     ["RunPreflight"]),
    ("operator stop while ready", at(State.ready), v.StopRequested(), 5, State.stopping, ["Stop"]),
    ("operator stop during backoff", at(State.backoff, deadline=10), v.StopRequested(), 5, State.stopped, []),
    ("operator stop while failed keeps the breaker", at(State.failed, **FAILED), v.StopRequested(), 5,
     State.failed, []),
    ("operator start when stopped", at(State.stopped, intent=Intent.stop), v.StartRequested(), 5,
     State.preflight, ["RunPreflight"]),
    ("operator start during a stop: start once it is done", at(State.stopping, after=After.stay),
     v.StartRequested(), 5, State.stopping, []),
    ("start does not clear the breaker", at(State.failed, **FAILED), v.StartRequested(), 5, State.failed, []),
    ("reset clears the breaker and starts", at(State.failed, **FAILED), v.ResetRequested(), 5, State.preflight,
     ["RunPreflight"]),
    ("reset clears the breaker, stop remembered → stopped", at(State.failed, intent=Intent.stop, **FAILED),
     v.ResetRequested(), 5, State.stopped, []),
    ("restart while ready → stop then start", at(State.ready), v.RestartRequested(), 5, State.stopping, ["Stop"]),
    ("restart from failed → preflight", at(State.failed, **FAILED), v.RestartRequested(), 5, State.preflight,
     ["RunPreflight"]),
    ("shutdown while ready stops, the intent stays", at(State.ready), v.ShutdownRequested(), 5, State.stopping,
     ["Stop"]),
    ("stray exit while stopping is ignored", at(State.stopping, after=After.stay), v.Exited(CRASH), 5,
     State.stopping, []),
]


@pytest.mark.parametrize(("name", "m", "obs", "now", "state", "actions"), TABLE, ids=[t[0] for t in TABLE])
def test_transition_table(name, m, obs, now, state, actions) -> None:
    after, acts, edge = lifecycle.step(m, obs, now, LIMITS)
    assert after.state is state
    assert kinds(acts) == actions
    assert (edge is None) == ((m.state, type(obs)) in lifecycle.IGNORED)
    if state is not m.state:
        assert after.since == now
    assert after.breaker_open == (after.state is State.failed) == (after.breaker_reason is not None)
    assert (after.after is not None) == (after.state is State.stopping)


def test_every_pair_is_an_edge_or_ignored_exactly_once() -> None:
    pairs = {(s, o) for s in State for o in v.OBSERVATIONS}
    assert set(lifecycle.TABLE) | set(lifecycle.IGNORED) == pairs
    assert not set(lifecycle.TABLE) & set(lifecycle.IGNORED)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("obs", [
    v.Adopted(RUNNING_INSTANCE), v.Adopted(None), v.StartRequested(), v.StopRequested(), v.RestartRequested(),
    v.ResetRequested(), v.ShutdownRequested(), v.PreflightDone(), v.PreflightDone(CRASH),
    v.Launched(RUNNING_INSTANCE, LaunchTiming(0.0)), v.LaunchFailed(CRASH), v.Progress(), v.BecameReady(),
    v.HealthDegraded("x"), v.HealthRecovered(), v.HealthFailed(CRASH), v.Exited(CRASH), v.StopDone(), v.Tick(),
], ids=lambda o: type(o).__name__)
def test_every_edge_leads_where_the_table_says_and_keeps_the_invariants(state: State, obs: v.Observation) -> None:
    before = at(state, started_at=0, **(FAILED if state is State.failed else {}),
                **({"after": After.recover, "answering": CRASH} if state is State.stopping else {}),
                **({"deadline": 1.0} if state is State.backoff else {}))
    after, actions, edge = lifecycle.step(before, obs, 2.0, LIMITS)
    if edge is None:
        assert after is before and actions == []
        return
    assert after.state in lifecycle.TABLE[(state, type(obs))].to
    assert after.breaker_open == (after.breaker_reason is not None)
    assert (after.after is not None) == (after.state is State.stopping)
    if any(isinstance(a, v.Launch) for a in actions):
        assert after.state is State.starting


def run(m: Machine, *steps, limits: Limits = LIMITS) -> Machine:
    for obs, now in steps:
        m = step(m, obs, now, limits)
    return m


def crash_cycle(m: Machine, now: float) -> Machine:
    return run(m, (v.Tick(), now), (v.PreflightDone(), now), (v.Exited(CRASH), now + 1), (v.StopDone(), now + 1))


def test_repeated_crashes_back_off_geometrically_then_open_the_breaker() -> None:
    m = run(at(State.preflight), (v.PreflightDone(), 0), (v.Exited(CRASH), 1), (v.StopDone(), 1))
    assert m.state is State.backoff and m.deadline == pytest.approx(11)
    m = crash_cycle(m, 11)
    assert m.state is State.backoff and m.deadline == pytest.approx(12 + 20)
    m = crash_cycle(m, 32)
    assert m.state is State.failed and m.breaker_open
    assert "3 failures" in (m.breaker_reason or "")
    assert m.restarts == 2 and m.launches == 3
    m2, acts, _ = lifecycle.step(m, v.ResetRequested(), 40, LIMITS)
    assert m2.state is State.preflight and not m2.breaker_open and kinds(acts) == ["RunPreflight"]


def test_stop_then_start_never_passes_an_open_breaker() -> None:
    m = run(at(State.failed, **FAILED), (v.StopRequested(), 1), (v.StartRequested(), 2))
    assert m.state is State.failed and m.intent is Intent.stop
    assert refusal(m, "start") is not None and "breaker is open" in (refusal(m, "start") or "")
    m = run(m, (v.RestartRequested(), 3))
    assert m.state is State.preflight and not m.breaker_open and m.restart_state == RestartState()


def test_operator_restart_closes_the_breaker_and_forgets_the_budget() -> None:
    m = at(State.failed, **FAILED, restart_state=RestartState(consecutive=3))
    m = step(m, v.RestartRequested(), 5)
    assert not m.breaker_open and m.restart_state.consecutive == 0 and m.restart_reason == "operator"


JITTERY = replace(LIMITS, restart=replace(LIMITS.restart, jitter=0.5))
HOST = failure(FailureClass.host_unavailable)
PEER = failure(FailureClass.peer_lost)


@pytest.mark.parametrize(("m", "obs"), [
    (at(State.preflight), lambda rand: v.PreflightDone(CRASH, rand=rand)),
    (at(State.preflight), lambda rand: v.PreflightDone(HOST, rand=rand)),  # a wait: the engine does not answer
    (at(State.stopping, answering=CRASH, after=After.recover), lambda rand: v.StopDone(rand=rand)),
    (at(State.stopping, answering=PEER, after=After.recover), lambda rand: v.StopDone(rand=rand)),  # a wait
], ids=["preflight failed", "preflight waits", "stop after a failure", "stop then wait for the peer"])
def test_every_backoff_is_jittered_by_the_observations_draw(m: Machine, obs) -> None:
    low, high = step(m, obs(0.0), 0, JITTERY), step(m, obs(0.99), 0, JITTERY)
    assert low.state is high.state is State.backoff
    assert low.deadline == pytest.approx(5.0) and high.deadline == pytest.approx(14.9)


@pytest.mark.parametrize("intent", list(Intent))
@pytest.mark.parametrize("state", [State.starting, State.ready, State.degraded, State.preflight])
def test_a_shutdown_stops_vllm_and_leaves_the_operators_intent_as_it_was(state: State, intent: Intent) -> None:
    m = run(at(state, intent=intent, started_at=0), (v.ShutdownRequested(), 1), (v.StopDone(), 2))
    assert m.state is State.stopped and m.intent is intent
    assert remembered(m).intent is intent


def test_last_failure_is_kept_for_status() -> None:
    m = run(at(State.ready), (v.Exited(CRASH), 1), (v.StopDone(), 2))
    assert m.last_failure == CRASH


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ([(v.Exited(CRASH), 1), (v.StopDone(), 1), (v.Tick(), 20), (v.PreflightDone(), 20)], "engine_dead"),
        ([(v.RestartRequested(), 1), (v.StopDone(), 2), (v.PreflightDone(), 2)], "operator"),
    ],
)
def test_restart_reason_names_what_caused_the_next_launch(steps, reason: str) -> None:
    m = run(at(State.ready, launches=1), *steps)
    assert m.state is State.starting and m.launches == 2 and m.restart_reason == reason


LED = replace(LIMITS, led=True)


def test_a_led_worker_waits_for_the_head_at_boot_and_after_a_failure() -> None:
    m = step(at(State.adopting), v.Adopted(None), 0, LED)
    assert m.state is State.stopped
    m = run(at(State.ready), (v.Exited(CRASH), 1), (v.StopDone(), 2), limits=LED)
    assert m.state is State.stopped and m.last_failure == CRASH
    m2, acts, _ = lifecycle.step(at(State.preflight), v.PreflightDone(CRASH), 3, LED)
    assert m2.state is State.stopped and kinds(acts) == ["RecordIncident"]


def test_an_unreachable_peer_is_waited_for_without_spending_the_budget() -> None:
    lost = failure(FailureClass.peer_lost)
    m = at(State.preflight)
    for now in range(10):
        m = step(m, v.PreflightDone(lost), float(now * 1000))
        assert m.state is State.backoff and not m.breaker_open
        m = replace(m, state=State.preflight)
    assert m.restart_state.strikes == ()


def test_what_is_remembered_restores_the_same_lifecycle() -> None:
    m = run(at(State.ready), (v.StopRequested(), 1))
    r = remembered(m)
    assert r.intent is Intent.stop
    assert restore(r, 100).intent is Intent.stop and restore(r, 100).state is State.adopting
    failed = at(State.failed, **FAILED, restart_state=RestartState(consecutive=2))
    assert restore(remembered(failed), 0).breaker_reason == FAILED["breaker_reason"]
    assert remembered(at(State.backoff, deadline=30.0)).backoff_until == 30.0
    assert remembered(at(State.ready, deadline=None)) == Remembered()


def test_commands_are_refused_while_adopting_and_a_shutdown_waits_for_quiet() -> None:
    assert refusal(at(State.adopting), "stop") is not None
    assert refusal(at(State.ready), "stop") is None
    assert not quiescent(at(State.stopping, after=After.stay)) and quiescent(at(State.stopped))


@pytest.mark.parametrize(("ready_for", "consecutive", "delay"), [(1000.0, 1, 10.0), (100.0, 4, 80.0)])
def test_a_stable_run_that_fails_starts_the_count_over(ready_for: float, consecutive: int, delay: float) -> None:
    """Soak seed 11: the stop cleared the run's ready time before the policy saw the failure, so no run was
    ever stable — every failure, however long the run before it, was one more in a row (and the next backoff
    longer), and consecutive_limit opened the breaker on failures weeks apart."""
    limits = replace(LIMITS, restart=replace(LIMITS.restart, stable_after_s=600.0))
    m = at(State.starting, started_at=0, restart_state=RestartState(consecutive=3))
    m = step(m, v.BecameReady(), 0, limits)
    m = step(m, v.HealthFailed(CRASH), ready_for, limits)
    m = step(m, v.StopDone(), ready_for + 1, limits)
    assert m.state is State.backoff and m.restart_state.consecutive == consecutive
    assert m.deadline - m.since == pytest.approx(delay)
    assert m.restart_state.ready_since is None  # the run is over


def test_a_crash_right_after_a_peer_outage_is_one_failure_not_the_breaker() -> None:
    """Soak seed 11: five waits for a lost peer, then one crash, opened a consecutive_limit of 6."""
    limits = replace(LIMITS, restart=replace(LIMITS.restart, consecutive_limit=2))
    lost = failure(FailureClass.peer_lost)
    m, t = at(State.ready, started_at=0), 0.0
    for _ in range(5):
        m = step(m, v.HealthFailed(lost), t, limits)
        m = step(m, v.StopDone(), t + 1, limits)
        assert m.state is State.backoff
        t = m.deadline
        m = step(m, v.Tick(), t, limits)
        m = step(step(m, v.PreflightDone(), t, limits), v.BecameReady(), t + 1, limits)
    assert (m.restart_state.consecutive, m.restart_state.waits) == (0, 5)
    m = step(m, v.Exited(CRASH), t + 2, limits)
    m = step(m, v.StopDone(), t + 3, limits)
    assert m.state is State.backoff and m.restart_state.consecutive == 1
