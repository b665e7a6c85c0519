"""Restart policy: after a failure, restart after how long, or give up. Pure.

moby's `ShouldRestart(exitCode, manuallyStopped, duration)` has the right inputs but takes a lock and starts
a timer. Here a decision is a value; the caller sleeps, logs and changes state. Time is monotonic seconds,
passed in; randomness (jitter) is a float in [0, 1), passed in.

The breaker itself is not kept here: `GiveUp` is the decision to open it, and the lifecycle machine's `failed`
state is its one representation (only `sparkctl reset`/`restart` leave it). How a class is treated (restartable,
its weight in the budget) comes from the one failure table, `sparkd.supervisor.failures.TREATMENT`.

Rules, in the order `on_failure` applies them:

1. A run that had been ready for `stable_after_s` resets the consecutive count: a failure after a long
   healthy run restarts quickly.
2. The failure is recorded in the budget window with its class's weight: `Budget.guard_kill` weighs
   `guard_kill_weight` (memory-guard kills open the breaker faster), `Budget.one` weighs 1. Failures older
   than `budget_window_s` drop out. (`Budget.none` classes never reach `on_failure`: they wait, `on_wait`.)
3. A class that is not restartable (a config error) gives up at once: the same launch fails the same way.
3b. The same failure twice in a row before ``ready`` gives up too, whatever its class: the same first evidence line,
   normalised (:mod:`sparkd.supervisor.repeat`), from two launches that never became ready says retrying will not
   help — a net under the rules, for what no rule knows. A run that became ready in between starts it over.
4. Weighted failures in the window reaching `budget_failures` give up.
5. `consecutive_limit` failures in a row without a stable run give up. This catches the slow crash loop the
   window cannot: an 8–10 minute cold start plus the 300 s cap fits only two failures in 30 minutes, and
   every cycle on GB10 leaks memory the driver never gives back. Waits (`on_wait`) between them are not
   failures and do not count.
6. Otherwise restart after `min(initial * factor**(n-1), max)`, jittered by ±`jitter` (the cap applies
   before the jitter), where n counts the failures and the waits since the last stable run, this one included.

`on_wait` (a `Budget.none` class: the peer node, the Docker engine, the guard's start gate) follows rules 1 and
6 only: a wait never gives up and never counts toward the budget or the consecutive limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkd.supervisor.failures import TREATMENT, Budget, FailureClass
from sparkd.supervisor.repeat import quote, signature

__all__ = [
    "Decision",
    "GiveUp",
    "Restart",
    "RestartPolicy",
    "RestartState",
    "Strike",
    "base_delay",
    "is_stable",
    "on_failure",
    "on_ready",
    "on_stopped",
    "on_wait",
    "reset",
    "weight",
    "window_weight",
]


@dataclass(frozen=True)
class RestartPolicy:
    backoff_initial_s: float = 10.0  # delay before the first restart
    backoff_factor: float = 2.0  # each consecutive failure multiplies the delay by this
    backoff_max_s: float = 300.0  # the delay never grows past this (before jitter)
    jitter: float = 0.1  # ± this fraction of the delay, so two nodes do not restart in lockstep
    stable_after_s: float = 600.0  # ready this long before failing resets the consecutive count
    budget_failures: int = 5  # this many weighted failures in the window open the breaker
    budget_window_s: float = 1800.0  # the sliding window the budget counts over
    guard_kill_weight: int = 2  # a killed_by_guard failure counts this many toward the budget
    consecutive_limit: int | None = 6  # this many failures in a row without a stable run open the breaker

    def __post_init__(self) -> None:
        if self.backoff_initial_s < 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("need 0 <= backoff_initial_s <= backoff_max_s")
        if self.backoff_factor < 1:
            raise ValueError("backoff_factor must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        if self.budget_failures < 1 or self.budget_window_s <= 0 or self.guard_kill_weight < 1:
            raise ValueError("budget_failures, budget_window_s and guard_kill_weight must be positive")
        if self.consecutive_limit is not None and self.consecutive_limit < 1:
            raise ValueError("consecutive_limit must be positive or None")


@dataclass(frozen=True)
class Strike:
    """One failure as the budget sees it."""

    at: float  # monotonic seconds
    weight: int
    cls: FailureClass


@dataclass(frozen=True)
class RestartState:
    consecutive: int = 0  # failures since the last stable run (or reset)
    strikes: tuple[Strike, ...] = ()  # failures inside the budget window, oldest first
    ready_since: float | None = None  # when the current run became ready; None while not ready
    # Waits since the last stable run (or reset): they lengthen the delay, never count toward a limit. Not kept
    # across a daemon restart (only the next delay depends on it).
    waits: int = 0
    # The normalised evidence of the last failure, while no run since it became ready (rule 3b): None otherwise.
    repeat: str | None = None


@dataclass(frozen=True)
class Restart:
    delay_s: float
    attempt: int  # failures and waits since the last stable run, this one included; 1 for the first


@dataclass(frozen=True)
class GiveUp:
    reason: str


Decision = Restart | GiveUp

_RESET_HINT = "fix the cause, then run `sparkctl reset`"


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def base_delay(policy: RestartPolicy, attempt: int) -> float:
    """The un-jittered delay before restart number `attempt` (1-based), capped."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    delay = policy.backoff_initial_s
    for _ in range(attempt - 1):  # multiply step by step: factor**n overflows a float long before the cap
        delay *= policy.backoff_factor
        if delay >= policy.backoff_max_s:
            return policy.backoff_max_s
    return min(delay, policy.backoff_max_s)


def _jittered(policy: RestartPolicy, delay: float, rand: float) -> float:
    return max(0.0, delay * (1.0 + policy.jitter * (2.0 * rand - 1.0)))


def is_stable(state: RestartState, policy: RestartPolicy, now: float) -> bool:
    """Has the current run been ready long enough that a failure now would restart quickly?"""
    return state.ready_since is not None and now - state.ready_since >= policy.stable_after_s


def _in_window(strikes: tuple[Strike, ...], policy: RestartPolicy, now: float) -> tuple[Strike, ...]:
    return tuple(s for s in strikes if now - s.at < policy.budget_window_s)


def window_weight(state: RestartState, policy: RestartPolicy, now: float) -> int:
    """Weighted failures inside the budget window at `now` (the transition log shows it)."""
    return sum(s.weight for s in _in_window(state.strikes, policy, now))


def on_ready(state: RestartState, now: float) -> RestartState:
    """The instance became ready. Repeated calls keep the first time. A failure after this is no repeat of one
    before it (rule 3b)."""
    if state.ready_since is not None:
        return state
    return replace(state, ready_since=now, repeat=None)


def on_stopped(state: RestartState) -> RestartState:
    """The instance was stopped on purpose: not a failure, but its ready period is over."""
    if state.ready_since is None:
        return state
    return replace(state, ready_since=None)


def reset(state: RestartState) -> RestartState:
    """`sparkctl reset`/`restart`: forget all failures (a running instance stays ready since when it was)."""
    return RestartState(ready_since=state.ready_since)  # the repeat too: the operator says the cause is fixed


def weight(policy: RestartPolicy, failure_class: FailureClass) -> int:
    """What one failure of this class costs in the restart budget."""
    budget = TREATMENT[failure_class].budget
    return {Budget.one: 1, Budget.guard_kill: policy.guard_kill_weight, Budget.none: 0}[budget]


def _budget_reason(strikes: tuple[Strike, ...], policy: RestartPolicy) -> str:
    weight = sum(s.weight for s in strikes)
    guard_kills = sum(1 for s in strikes if s.cls is FailureClass.killed_by_guard)
    failures = "failure" if len(strikes) == 1 else "failures"
    note = ""
    if guard_kills:
        note = f", {weight} counting memory-guard kills ×{policy.guard_kill_weight}"
    return (
        f"{len(strikes)} {failures} in {_duration(policy.budget_window_s)}{note} "
        f"(restart budget {policy.budget_failures}); {_RESET_HINT}"
    )


def on_failure(
    state: RestartState,
    policy: RestartPolicy,
    failure_class: FailureClass,
    now: float,
    rand: float,
    evidence: str | None = None,
) -> tuple[RestartState, Decision]:
    """Decide what follows an unrequested end of the instance at `now`. `rand` is uniform in [0, 1); `evidence` is
    the log line the failure rests on, if any (rule 3b)."""
    if not 0.0 <= rand < 1.0:
        raise ValueError("rand must be in [0, 1)")
    stable = is_stable(state, policy, now)
    consecutive = (0 if stable else state.consecutive) + 1
    waits = 0 if stable else state.waits
    strikes = (*_in_window(state.strikes, policy, now), Strike(now, weight(policy, failure_class), failure_class))
    unready = state.ready_since is None  # this run never became ready
    seen = signature(evidence) if unready else None
    after = RestartState(consecutive=consecutive, strikes=strikes, ready_since=None, waits=waits, repeat=seen)

    reason: str | None = None
    if not TREATMENT[failure_class].restartable:
        reason = (f"{failure_class.value.replace('_', ' ')} fails the same way every time, so sparkd does not "
                  f"retry it; {_RESET_HINT}")
    elif seen is not None and evidence is not None and seen == state.repeat:
        reason = (f"the same failure twice in a row before vLLM was ready ({failure_class.value}): {quote(evidence)} "
                  f"— retrying will not help; {_RESET_HINT}")
    elif sum(s.weight for s in strikes) >= policy.budget_failures:
        reason = _budget_reason(strikes, policy)
    elif policy.consecutive_limit is not None and consecutive >= policy.consecutive_limit:
        reason = (
            f"{consecutive} failures in a row without a stable run "
            f"(limit {policy.consecutive_limit}); {_RESET_HINT}"
        )
    if reason is not None:
        return after, GiveUp(reason)

    attempt = consecutive + waits
    delay = _jittered(policy, base_delay(policy, attempt), rand)
    return after, Restart(delay_s=delay, attempt=attempt)


def on_wait(state: RestartState, policy: RestartPolicy, now: float, rand: float) -> tuple[RestartState, Restart]:
    """Try again later for a reason outside vLLM (`Budget.none`: the peer node, the Docker engine, the guard's
    start gate): the delay grows like a failure's, but nothing counts toward the budget or the consecutive
    limit — sparkd waits, it does not give up. A stable run that ends in a wait starts the counts over."""
    stable = is_stable(state, policy, now)
    consecutive = 0 if stable else state.consecutive
    waits = (0 if stable else state.waits) + 1
    attempt = consecutive + waits
    after = RestartState(consecutive=consecutive, strikes=state.strikes, ready_since=None, waits=waits,
                         repeat=None if stable else state.repeat)
    return after, Restart(_jittered(policy, base_delay(policy, attempt), rand), attempt)
