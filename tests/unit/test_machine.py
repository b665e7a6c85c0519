"""The lifecycle state machine, table-driven: (state, observation, time) → (state, actions). No clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkd.supervisor import machine as sm
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.machine import State
from sparkd.supervisor.policy import RestartPolicy

LIMITS = sm.Limits(
    startup_timeout_s=100.0,
    startup_silence_s=30.0,
    startup_extension_s=5.0,
    restart=RestartPolicy(
        backoff_initial_s=10.0, jitter=0.0, budget_failures=3, budget_window_s=1000.0, consecutive_limit=None
    ),
)


def failure(cls: FailureClass = FailureClass.engine_dead) -> Failure:
    return Failure(cls=cls, sentence=f"{cls} happened", exit_code=1, signal=None, evidence=None)


CRASH = failure()
CONFIG = failure(FailureClass.config_error)


def at(state: State, **kw) -> sm.Machine:
    return replace(sm.Machine(), state=state, **kw)


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


# (name, machine, observation, now, expected state, expected action kinds)
TABLE = [
    ("boot finds nothing → preflight", at(State.adopting), sm.Adopted(False), 0, State.preflight, ["RunPreflight"]),
    (
        "boot finds nothing, stopped wanted",
        at(State.adopting, want_running=False),
        sm.Adopted(False),
        0,
        State.stopped,
        [],
    ),
    (
        "boot adopts a running instance → starting, no launch",
        at(State.adopting),
        sm.Adopted(True),
        0,
        State.starting,
        [],
    ),
    ("preflight ok → launch", at(State.preflight), sm.PreflightDone(), 1, State.starting, ["Launch"]),
    (
        "preflight fails → incident + backoff",
        at(State.preflight),
        sm.PreflightDone(CRASH),
        1,
        State.backoff,
        ["RecordIncident"],
    ),
    (
        "preflight config error → failed at once",
        at(State.preflight),
        sm.PreflightDone(CONFIG),
        1,
        State.failed,
        ["RecordIncident"],
    ),
    ("ready from starting", at(State.starting, started_at=0), sm.BecameReady(), 5, State.ready, []),
    ("progress keeps starting", at(State.starting, started_at=0), sm.Progress(), 5, State.starting, []),
    (
        "exit during start → stop (sweep) with incident",
        at(State.starting, started_at=0),
        sm.Exited(CRASH),
        5,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    (
        "launch failed → stop with incident",
        at(State.starting),
        sm.LaunchFailed(CONFIG),
        5,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    (
        "silent start past the silence limit → stop",
        at(State.starting, started_at=0, last_progress_at=10),
        sm.Tick(),
        41,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    (
        "start within silence limit → keep waiting",
        at(State.starting, started_at=0, last_progress_at=10),
        sm.Tick(),
        39,
        State.starting,
        [],
    ),
    (
        "past the budget but progressing → the budget is extended",
        at(State.starting, started_at=0, last_progress_at=99),
        sm.Tick(),
        100,
        State.starting,
        [],
    ),
    (
        "past the budget and no progress for the extension → stop",
        at(State.starting, started_at=0, last_progress_at=90),
        sm.Tick(),
        100,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    ("ready degrades", at(State.ready), sm.HealthDegraded("1 probe failed"), 5, State.degraded, []),
    ("degraded recovers", at(State.degraded), sm.HealthRecovered(), 5, State.ready, []),
    (
        "health fails → stop",
        at(State.degraded),
        sm.HealthFailed(failure(FailureClass.stall)),
        5,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    (
        "exit 0 while ready is a failure too",
        at(State.ready),
        sm.Exited(CRASH),
        5,
        State.stopping,
        ["RecordIncident", "Stop"],
    ),
    (
        "stop done after a failure → backoff",
        at(State.stopping, pending=CRASH, after_stop=sm.After.recover),
        sm.StopDone(),
        5,
        State.backoff,
        [],
    ),
    (
        "stop done after a config error → failed",
        at(State.stopping, pending=CONFIG, after_stop=sm.After.recover),
        sm.StopDone(),
        5,
        State.failed,
        [],
    ),
    (
        "stop done after operator stop → stopped",
        at(State.stopping, want_running=False),
        sm.StopDone(),
        5,
        State.stopped,
        [],
    ),
    (
        "stop done after operator restart → preflight",
        at(State.stopping, after_stop=sm.After.restart),
        sm.StopDone(),
        5,
        State.preflight,
        ["RunPreflight"],
    ),
    ("backoff not elapsed", at(State.backoff, deadline=10), sm.Tick(), 9, State.backoff, []),
    ("backoff elapsed → preflight", at(State.backoff, deadline=10), sm.Tick(), 10, State.preflight, ["RunPreflight"]),
    ("operator stop while ready", at(State.ready), sm.StopRequested(), 5, State.stopping, ["Stop"]),
    ("operator stop during backoff", at(State.backoff, deadline=10), sm.StopRequested(), 5, State.stopped, []),
    (
        "operator start when stopped",
        at(State.stopped, want_running=False),
        sm.StartRequested(),
        5,
        State.preflight,
        ["RunPreflight"],
    ),
    ("start does not clear the breaker", at(State.failed), sm.StartRequested(), 5, State.failed, []),
    (
        "reset clears the breaker and starts",
        at(State.failed),
        sm.ResetRequested(),
        5,
        State.preflight,
        ["RunPreflight"],
    ),
    ("restart while ready → stop then start", at(State.ready), sm.RestartRequested(), 5, State.stopping, ["Stop"]),
    ("restart from failed → preflight", at(State.failed), sm.RestartRequested(), 5, State.preflight, ["RunPreflight"]),
    ("stray exit while stopping is ignored", at(State.stopping), sm.Exited(CRASH), 5, State.stopping, []),
]


@pytest.mark.parametrize(("name", "m", "obs", "now", "state", "actions"), TABLE, ids=[t[0] for t in TABLE])
def test_transition_table(name, m, obs, now, state, actions) -> None:
    after, acts = sm.step(m, obs, now, LIMITS)
    assert after.state is state
    assert kinds(acts) == actions
    if state is not m.state:
        assert after.since == now


def run(m: sm.Machine, *steps) -> sm.Machine:
    for obs, now in steps:
        m, _ = sm.step(m, obs, now, LIMITS)
    return m


def crash_cycle(m: sm.Machine, now: float) -> sm.Machine:
    return run(
        m, (sm.Tick(), now), (sm.PreflightDone(), now), (sm.Exited(CRASH), now + 1), (sm.StopDone(rand=0.5), now + 1)
    )


def test_repeated_crashes_back_off_geometrically_then_open_the_breaker() -> None:
    m = run(at(State.preflight), (sm.PreflightDone(), 0), (sm.Exited(CRASH), 1), (sm.StopDone(), 1))
    assert m.state is State.backoff and m.deadline == pytest.approx(11)
    m = crash_cycle(m, 11)
    assert m.state is State.backoff and m.deadline == pytest.approx(12 + 20)
    m = crash_cycle(m, 32)
    assert m.state is State.failed and m.breaker_open
    assert "3 failures" in (m.restart_state.breaker_reason or "")
    assert m.restarts == 2 and m.launches == 3
    m, acts = sm.step(m, sm.ResetRequested(), 40, LIMITS)
    assert m.state is State.preflight and not m.breaker_open and kinds(acts) == ["RunPreflight"]


def test_last_failure_is_kept_for_status() -> None:
    m = run(at(State.ready), (sm.Exited(CRASH), 1), (sm.StopDone(), 2))
    assert m.last_failure == CRASH


def test_every_state_handles_every_observation_without_error() -> None:
    observations = [
        sm.Adopted(True),
        sm.StartRequested(),
        sm.StopRequested(),
        sm.RestartRequested(),
        sm.ResetRequested(),
        sm.PreflightDone(),
        sm.Launched(),
        sm.LaunchFailed(CRASH),
        sm.Progress(),
        sm.BecameReady(),
        sm.HealthDegraded("x"),
        sm.HealthRecovered(),
        sm.HealthFailed(CRASH),
        sm.Exited(CRASH),
        sm.StopDone(),
        sm.Tick(),
    ]
    for state in State:
        for obs in observations:
            after, actions = sm.step(at(state, started_at=0), obs, 1, LIMITS)
            assert isinstance(after.state, State)
            if sm.Launch() in actions:
                assert after.state is State.starting


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ([(sm.Exited(CRASH), 1), (sm.StopDone(), 1), (sm.Tick(), 20), (sm.PreflightDone(), 20)], "engine_dead"),
        ([(sm.RestartRequested(), 1), (sm.StopDone(), 2), (sm.PreflightDone(), 2)], "operator"),
    ],
)
def test_restart_reason_names_what_caused_the_next_launch(steps, reason: str) -> None:
    m = run(at(State.ready, launches=1), *steps)
    assert m.state is State.starting and m.launches == 2 and m.restart_reason == reason


LED = replace(LIMITS, led=True)


def test_a_led_worker_waits_for_the_head_at_boot_and_after_a_failure() -> None:
    m, acts = sm.step(at(State.adopting), sm.Adopted(False), 0, LED)
    assert m.state is State.stopped and acts == []
    m = run_with(LED, at(State.ready), (sm.Exited(CRASH), 1), (sm.StopDone(), 2))
    assert m.state is State.stopped and not m.want_running and m.last_failure == CRASH
    m, acts = sm.step(at(State.preflight), sm.PreflightDone(CRASH), 3, LED)
    assert m.state is State.stopped and kinds(acts) == ["RecordIncident"]


def test_an_unreachable_peer_is_waited_for_without_spending_the_budget() -> None:
    lost = failure(FailureClass.peer_lost)
    m = at(State.preflight)
    for now in range(10):
        m, _ = sm.step(m, sm.PreflightDone(lost), float(now * 1000), LIMITS)
        assert m.state is State.backoff and not m.breaker_open
        m = replace(m, state=State.preflight)
    assert m.restart_state.strikes == ()


def run_with(limits: sm.Limits, m: sm.Machine, *steps) -> sm.Machine:
    for obs, now in steps:
        m, _ = sm.step(m, obs, now, limits)
    return m
