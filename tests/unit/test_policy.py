"""Restart policy: scripted histories of (event, time) → decisions; no clock, no sleep."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.policy import (
    GiveUp,
    Restart,
    RestartPolicy,
    RestartState,
    base_delay,
    is_stable,
    on_failure,
    on_ready,
    on_stopped,
    on_wait,
    reset,
    weight,
    window_weight,
)

F = FailureClass
MID = 0.5  # rand that makes the jitter factor exactly 1


@dataclass(frozen=True)
class Ev:
    """One step of a history: what happened at `t`, and what the policy must answer."""

    kind: str  # "fail", "ready", "stopped", "reset"
    t: float
    cls: FailureClass = F.engine_dead
    expect: float | str | None = None  # Restart delay, a substring of the GiveUp reason, or None


def run(history: list[Ev], policy: RestartPolicy | None = None) -> RestartState:
    pol = policy or RestartPolicy()
    state = RestartState()
    for i, ev in enumerate(history):
        if ev.kind == "ready":
            state = on_ready(state, ev.t)
        elif ev.kind == "stopped":
            state = on_stopped(state)
        elif ev.kind == "reset":
            state = reset(state)
        else:
            state, decision = on_failure(state, pol, ev.cls, ev.t, MID)
            if isinstance(ev.expect, str):
                assert isinstance(decision, GiveUp), f"step {i}: {decision}"
                assert ev.expect in decision.reason, f"step {i}: {decision.reason}"
            else:
                assert isinstance(decision, Restart), f"step {i}: {decision}"
                assert decision.delay_s == pytest.approx(ev.expect), f"step {i}"
    return state


def fail(t: float, expect: float | str, cls: FailureClass = F.engine_dead) -> Ev:
    return Ev("fail", t, cls, expect)


def ready(t: float) -> Ev:
    return Ev("ready", t)


HISTORIES: dict[str, list[Ev]] = {
    "backoff doubles from 10 s": [fail(0, 10), fail(100, 20), fail(200, 40), fail(300, 80)],
    "fifth failure in the window opens the breaker": [
        fail(0, 10),
        fail(60, 20),
        fail(120, 40),
        fail(240, 80),
        fail(400, "5 failures in 30 min"),
    ],
    "config error gives up at once": [fail(0, "config error", F.config_error)],
    "config error after restarts still gives up": [fail(0, 10), fail(100, "does not retry", F.config_error)],
    "old failures slide out of the window": [
        # four failures, then a fifth after the first has left the 1800 s window: not five in the window
        fail(0, 10),
        fail(600, 20),
        fail(1200, 40),
        fail(1500, 80),
        fail(1801, 160),
    ],
    "a guard kill counts double toward the budget": [
        fail(0, 10),
        fail(100, 20),
        fail(200, 40, F.killed_by_guard),
        fail(300, "counting memory-guard kills ×2", F.killed_by_guard),
    ],
    "a long healthy run resets the backoff": [
        fail(0, 10),
        fail(100, 20),
        fail(200, 40),
        ready(400),
        fail(400 + 600, 10),
    ],
    "a short healthy run does not reset the backoff": [
        fail(0, 10),
        fail(100, 20),
        ready(300),
        fail(300 + 599, 40),
    ],
    "a stable run resets the delay but not the budget": [
        fail(0, 10),
        fail(50, 20),
        fail(100, 40),
        ready(150),
        fail(760, 10),
        fail(800, "5 failures"),
    ],
    "a stop ends the ready period": [fail(0, 10), ready(100), Ev("stopped", 200), fail(2000, 20)],
    "reset closes the breaker and clears the counters": [
        fail(0, "config error", F.config_error),
        Ev("reset", 10),
        fail(20, 10),
        fail(30, 20),
    ],
    "slow crash loop: six failures in a row without a stable run give up": [
        # ~15 min per cycle (10 min boot + backoff): never five in 30 min, but never stable either
        fail(0, 10),
        fail(900, 20),
        fail(1800, 40),
        fail(2700, 80),
        fail(3600, 160),
        fail(4500, "6 failures in a row without a stable run"),
    ],
}


@pytest.mark.parametrize("history", HISTORIES.values(), ids=HISTORIES.keys())
def test_history(history: list[Ev]) -> None:
    """Each scripted history yields exactly the expected decisions."""
    run(history)


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 160.0), (6, 300.0), (7, 300.0), (10_000, 300.0)],
)
def test_base_delay_is_geometric_and_capped(attempt: int, delay: float) -> None:
    """initial * factor**(n-1), capped at backoff_max_s, without overflowing for huge n."""
    assert base_delay(RestartPolicy(), attempt) == delay


@pytest.mark.parametrize(("rand", "factor"), [(0.0, 0.9), (0.25, 0.95), (0.5, 1.0), (0.75, 1.05), (0.999999, 1.1)])
def test_jitter_is_symmetric_and_bounded(rand: float, factor: float) -> None:
    """delay * (1 + jitter*(2*rand-1)): rand 0 → -10 %, rand → 1 approaches +10 %."""
    _, decision = on_failure(RestartState(), RestartPolicy(), F.engine_dead, 0.0, rand)
    assert isinstance(decision, Restart)
    assert decision.delay_s == pytest.approx(10.0 * factor, rel=1e-5)


def test_jitter_applies_after_the_cap() -> None:
    """At the cap the jittered delay stays within ±jitter of backoff_max_s."""
    pol = RestartPolicy(budget_failures=100, consecutive_limit=None)
    state = RestartState()
    for i in range(8):
        state, decision = on_failure(state, pol, F.engine_dead, i * 10_000.0, 0.999)
    assert isinstance(decision, Restart)
    assert 300.0 * 0.9 <= decision.delay_s <= 300.0 * 1.1


def test_no_jitter_policy_is_exact() -> None:
    """jitter=0 gives the base delay whatever rand is."""
    _, decision = on_failure(RestartState(), RestartPolicy(jitter=0.0), F.oom, 0.0, 0.0)
    assert decision == Restart(delay_s=10.0, attempt=1)


def test_attempt_counts_consecutive_failures() -> None:
    """The decision says which consecutive failure it answers."""
    state = RestartState()
    attempts = []
    for t in (0.0, 100.0, 200.0):
        state, decision = on_failure(state, RestartPolicy(), F.nccl, t, MID)
        assert isinstance(decision, Restart)
        attempts.append(decision.attempt)
    assert attempts == [1, 2, 3]


@pytest.mark.parametrize(("cls", "expected"), [(F.engine_dead, 1), (F.killed_by_guard, 3), (F.peer_lost, 0),
                                               (F.config_error, 1)])
def test_a_class_weighs_what_the_failure_table_says(cls: FailureClass, expected: int) -> None:
    assert weight(RestartPolicy(guard_kill_weight=3), cls) == expected


def test_a_class_that_is_not_restartable_gives_up_at_once() -> None:
    _, decision = on_failure(RestartState(), RestartPolicy(), F.config_error, 0.0, MID)
    assert isinstance(decision, GiveUp) and "config error fails the same way" in decision.reason


def test_give_up_reason_names_the_count_and_window() -> None:
    """The budget reason reads like "5 failures in 30 min" and says how to get out."""
    state = RestartState()
    for t in range(5):
        state, decision = on_failure(state, RestartPolicy(), F.engine_dead, float(t), MID)
    assert isinstance(decision, GiveUp)
    assert decision.reason.startswith("5 failures in 30 min (restart budget 5)")
    assert "sparkctl reset" in decision.reason


@pytest.mark.parametrize(("window_s", "text"), [(1800.0, "30 min"), (3600.0, "1 h"), (90.0, "90 s"), (21600.0, "6 h")])
def test_window_is_spelled_for_people(window_s: float, text: str) -> None:
    """The window in the reason is in the unit an operator would use."""
    pol = RestartPolicy(budget_failures=1, budget_window_s=window_s)
    _, decision = on_failure(RestartState(), pol, F.engine_dead, 0.0, MID)
    assert isinstance(decision, GiveUp) and f"in {text} " in decision.reason


def test_window_weight_counts_only_recent_failures() -> None:
    """Budget use is the weighted failures younger than the window."""
    pol = RestartPolicy()
    state = RestartState()
    state, _ = on_failure(state, pol, F.engine_dead, 0.0, MID)
    state, _ = on_failure(state, pol, F.killed_by_guard, 100.0, MID)
    assert window_weight(state, pol, 100.0) == 3
    assert window_weight(state, pol, 1800.0) == 2  # the t=0 failure is exactly one window old: out
    assert window_weight(state, pol, 1900.0) == 0


def test_on_ready_keeps_the_first_time_and_is_idempotent() -> None:
    """A second ready report does not restart the stable clock."""
    state = on_ready(RestartState(), 100.0)
    assert on_ready(state, 200.0) is state
    assert state.ready_since == 100.0


def test_is_stable() -> None:
    """Stable means ready for at least stable_after_s."""
    pol = RestartPolicy()
    state = on_ready(RestartState(), 100.0)
    assert not is_stable(state, pol, 699.0)
    assert is_stable(state, pol, 700.0)
    assert not is_stable(RestartState(), pol, 1e9)


def test_failure_ends_the_ready_period() -> None:
    """After a failure the instance is no longer ready; the next ready starts a new clock."""
    state = on_ready(RestartState(), 0.0)
    state, _ = on_failure(state, RestartPolicy(), F.engine_dead, 50.0, MID)
    assert state.ready_since is None


def test_reset_forgets_the_failures_but_not_a_running_ready_period() -> None:
    """reset() forgets every failure; an instance that is ready stays ready since when it was."""
    state, _ = on_failure(RestartState(), RestartPolicy(), F.config_error, 0.0, MID)
    assert reset(state) == RestartState()
    assert reset(on_ready(state, 50.0)) == RestartState(ready_since=50.0)


def test_on_stopped_without_ready_is_a_no_op() -> None:
    """Stopping an instance that never became ready changes nothing."""
    state = RestartState()
    assert on_stopped(state) is state


@pytest.mark.parametrize("rand", [-0.1, 1.0, 1.5])
def test_rand_out_of_range_is_rejected(rand: float) -> None:
    """rand must be a uniform draw in [0, 1)."""
    with pytest.raises(ValueError):
        on_failure(RestartState(), RestartPolicy(), F.engine_dead, 0.0, rand)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backoff_initial_s": -1.0},
        {"backoff_max_s": 5.0},
        {"backoff_factor": 0.5},
        {"jitter": 1.0},
        {"budget_failures": 0},
        {"budget_window_s": 0.0},
        {"guard_kill_weight": 0},
        {"consecutive_limit": 0},
    ],
)
def test_invalid_policy_is_rejected(kwargs: dict[str, float]) -> None:
    """Nonsense policies fail at construction, not at the first failure."""
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_defaults() -> None:
    """The defaults the design documents."""
    pol = RestartPolicy()
    assert (pol.backoff_initial_s, pol.backoff_factor) == (10.0, 2.0)
    assert (pol.backoff_max_s, pol.jitter) == (300.0, 0.1)
    assert (pol.stable_after_s, pol.budget_failures, pol.budget_window_s) == (600.0, 5, 1800.0)
    assert (pol.guard_kill_weight, pol.consecutive_limit) == (2, 6)


def test_waits_lengthen_the_delay_but_never_count_toward_the_limit() -> None:
    """Soak seed 11: a wait counted as one more failure in a row, so after a peer outage (or the guard's
    cool-down) of five retries the first real failure opened the breaker with '6 failures in a row'."""
    pol = RestartPolicy(jitter=0.0, consecutive_limit=6, budget_failures=100, backoff_max_s=1e6)
    state, decision = on_failure(RestartState(), pol, F.engine_dead, 0.0, MID)
    delays = [decision.delay_s]
    for t in range(1, 6):
        state, wait = on_wait(state, pol, float(t), MID)
        delays.append(wait.delay_s)
    state, decision = on_failure(state, pol, F.engine_dead, 10.0, MID)
    assert isinstance(decision, Restart), decision
    assert (state.consecutive, state.waits, decision.attempt) == (2, 5, 7)
    assert [*delays, decision.delay_s] == [10.0 * 2**n for n in range(7)]
    for t in range(11, 15):  # four more failures: six in a row, whatever the waits between them
        state, decision = on_failure(state, pol, F.engine_dead, float(t), MID)
    assert isinstance(decision, GiveUp) and "6 failures in a row" in decision.reason


def test_a_stable_run_that_ends_in_a_wait_starts_the_counts_over() -> None:
    pol = RestartPolicy(jitter=0.0, stable_after_s=600.0)
    state = RestartState(consecutive=4, waits=3, ready_since=0.0)
    state, wait = on_wait(state, pol, 700.0, MID)
    assert (state.consecutive, state.waits, state.ready_since, wait) == (0, 1, None, Restart(10.0, 1))
    state = RestartState(consecutive=4, waits=3, ready_since=0.0)
    state, wait = on_wait(state, pol, 100.0, MID)
    assert (state.consecutive, state.waits, wait.attempt) == (4, 4, 8)
