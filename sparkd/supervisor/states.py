"""The lifecycle's states and what the machine carries between observations. Pure data and predicates.

The transitions live in :mod:`sparkd.supervisor.lifecycle` (the table); this module is what they move.
``failed`` is the open restart breaker and its only representation; ``intent`` is the operator's (run or
stop); ``after`` says what follows the stop in progress. :class:`Remembered` is the part that outlives the
daemon (kept in the state directory by the shell).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from sparkd.supervisor import policy
from sparkd.supervisor.failures import Failure

__all__ = [
    "RUNNING", "SERVING", "UP", "After", "Intent", "Limits", "Machine", "Remembered", "State", "came_up", "quiescent",
    "refusal", "remembered", "restore",
]


class State(StrEnum):
    adopting = "adopting"
    stopped = "stopped"
    preflight = "preflight"
    starting = "starting"
    accepting = "accepting"  # vLLM answers; the acceptance gate decides whether it is ready (issue 37)
    ready = "ready"
    degraded = "degraded"
    stopping = "stopping"
    backoff = "backoff"
    failed = "failed"  # the restart breaker is open


RUNNING = frozenset({State.starting, State.accepting, State.ready, State.degraded})  # an instance exists, watched
SERVING = frozenset({State.ready, State.degraded})
UP = frozenset({State.accepting, *SERVING})  # vLLM's API answers (past its first /health 200)


def came_up(before: State, after: State) -> bool:
    """A start ended serving: from ``starting`` (no acceptance gate) or ``accepting`` into ready or degraded."""
    return after in SERVING and before in (State.starting, State.accepting)


class Intent(StrEnum):
    run = "run"  # vLLM should run (the default)
    stop = "stop"  # `sparkctl stop`: stopped it stays until start or restart


class After(StrEnum):
    """What follows the stop in progress."""

    stay = "stay"  # an operator stop or a shutdown: stopped
    restart = "restart"  # an operator restart: preflight at once
    recover = "recover"  # a failure (``Machine.answering``): backoff, wait, or the breaker


@dataclass(frozen=True)
class Limits:
    startup_timeout_s: float = 3600.0
    startup_silence_s: float = 900.0
    # Past the startup budget, a start whose log showed progress this recently keeps going.
    startup_extension_s: float = 300.0
    restart: policy.RestartPolicy = field(default_factory=policy.RestartPolicy)
    # A worker of a group: it starts only on the head's word and, after a failure, stops and waits for it.
    led: bool = False
    # The acceptance gate's budget with its margin: a start passes through ``accepting`` (None: no gate, ready at
    # once). Past it, the lifecycle takes the start as ready unverified (the gate's own budget ends it first).
    accept_s: float | None = None


@dataclass(frozen=True)
class Machine:
    state: State = State.adopting
    since: float = 0.0
    intent: Intent = Intent.run
    after: After | None = None  # set while stopping: what follows
    answering: Failure | None = None  # while stopping after a failure: the failure the stop answers
    breaker_reason: str | None = None  # set exactly while failed
    restarts: int = 0  # launches after the first, for status and metrics
    launches: int = 0
    started_at: float | None = None  # when the current launch began
    last_progress_at: float | None = None
    deadline: float | None = None  # backoff: when to try again; accepting: when the gate's budget is spent
    last_failure: Failure | None = None
    health_note: str | None = None  # why degraded
    restart_reason: str | None = None  # why the next launch is a restart: a failure class, "operator", "reset"
    restart_state: policy.RestartState = field(default_factory=policy.RestartState)

    @property
    def breaker_open(self) -> bool:
        return self.state is State.failed


def refusal(m: Machine, command: str) -> str | None:
    """Why an operator command is refused in this state, or None."""
    if m.state is State.adopting:
        return "sparkd is still looking for the instance it launched before (adopting); try again in a moment"
    if command == "start" and m.state is State.failed:
        return (f"the restart breaker is open ({m.breaker_reason}); use `sparkctl reset` or `sparkctl restart`")
    return None


def quiescent(m: Machine) -> bool:
    """Nothing of vLLM's is running or being changed: a shutting-down daemon may exit now."""
    return m.state in (State.stopped, State.failed, State.backoff)


# ---- what outlives the daemon ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Remembered:
    """What the lifecycle must remember across a daemon restart or a watchdog kill (times are monotonic;
    the shell's store converts them to wall time and back)."""

    intent: Intent = Intent.run
    restart_state: policy.RestartState = field(default_factory=policy.RestartState)
    breaker_reason: str | None = None  # the breaker is open
    backoff_until: float | None = None
    last_failure: Failure | None = None


def remembered(m: Machine) -> Remembered:
    return Remembered(intent=m.intent, restart_state=replace(m.restart_state, ready_since=None),
                      breaker_reason=m.breaker_reason,
                      backoff_until=m.deadline if m.state is State.backoff else None, last_failure=m.last_failure)


def restore(r: Remembered, now: float) -> Machine:
    """The machine a daemon boots with: still adopting, with the lifecycle's memory in place."""
    return Machine(state=State.adopting, since=now, intent=r.intent, restart_state=r.restart_state,
                   breaker_reason=r.breaker_reason, deadline=r.backoff_until, last_failure=r.last_failure)
