"""The lifecycle state machine: a pure function of (machine, observation, monotonic time).

``step`` returns the next machine and the actions the daemon must carry out. It reads no clock, does no
I/O and draws no random numbers (jitter arrives inside the observation), so every transition is tested
with tables. The daemon (:mod:`sparkd.daemon`) turns the world into observations and actions into effects.

States (DESIGN.md §4): adopting → stopped | preflight → starting → ready ⇄ degraded → stopping →
backoff → preflight … | failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from sparkd.supervisor import policy
from sparkd.supervisor.failures import Failure, FailureClass


class State(StrEnum):
    adopting = "adopting"
    stopped = "stopped"
    preflight = "preflight"
    starting = "starting"
    ready = "ready"
    degraded = "degraded"
    stopping = "stopping"
    backoff = "backoff"
    failed = "failed"


RUNNING = frozenset({State.starting, State.ready, State.degraded})  # an instance exists and is watched
SERVING = frozenset({State.ready, State.degraded})


# ---- observations
@dataclass(frozen=True)
class Adopted:
    """Result of the boot-time search: ``found`` an instance this node launched earlier."""

    found: bool


@dataclass(frozen=True)
class StartRequested:
    pass


@dataclass(frozen=True)
class StopRequested:
    pass


@dataclass(frozen=True)
class RestartRequested:
    """Operator restart: also closes the breaker (like reset), then starts afresh."""


@dataclass(frozen=True)
class ResetRequested:
    pass


@dataclass(frozen=True)
class PreflightDone:
    failure: Failure | None = None  # None: the node is ready to launch


@dataclass(frozen=True)
class Launched:
    pass


@dataclass(frozen=True)
class LaunchFailed:
    failure: Failure


@dataclass(frozen=True)
class Progress:
    """A log line that means the start is moving (a shard loaded, KV cache sized, graphs captured)."""


@dataclass(frozen=True)
class BecameReady:
    pass


@dataclass(frozen=True)
class HealthDegraded:
    reason: str


@dataclass(frozen=True)
class HealthRecovered:
    pass


@dataclass(frozen=True)
class HealthFailed:
    failure: Failure


@dataclass(frozen=True)
class Exited:
    """The instance's main process ended. The daemon classified it (pure :func:`classify`)."""

    failure: Failure


@dataclass(frozen=True)
class StopDone:
    """The stop action finished: the tree is gone and the node swept. ``rand`` feeds backoff jitter."""

    rand: float = 0.5


@dataclass(frozen=True)
class Tick:
    """Time passed; deadlines (startup budget, backoff) are checked against ``now``."""


Observation = (
    Adopted | StartRequested | StopRequested | RestartRequested | ResetRequested | PreflightDone | Launched
    | LaunchFailed | Progress | BecameReady | HealthDegraded | HealthRecovered | HealthFailed | Exited
    | StopDone | Tick
)


# ---- actions
@dataclass(frozen=True)
class RunPreflight:
    pass


@dataclass(frozen=True)
class Launch:
    pass


@dataclass(frozen=True)
class Stop:
    reason: str


@dataclass(frozen=True)
class RecordIncident:
    failure: Failure


Action = RunPreflight | Launch | Stop | RecordIncident


# ---- the machine
@dataclass(frozen=True)
class Limits:
    startup_timeout_s: float = 3600.0
    startup_silence_s: float = 900.0
    # Past the startup budget, a start whose log showed progress this recently keeps going.
    startup_extension_s: float = 300.0
    restart: policy.RestartPolicy = field(default_factory=policy.RestartPolicy)
    # A worker of a pair: it starts only on the head's word and, after a failure, stops and waits for it.
    led: bool = False


class After(StrEnum):
    """What follows the current stop."""

    stay_stopped = "stay_stopped"
    restart = "restart"  # operator restart
    recover = "recover"  # a failure: backoff or breaker


@dataclass(frozen=True)
class Machine:
    state: State = State.adopting
    since: float = 0.0
    want_running: bool = True
    restarts: int = 0  # launches after the first, for status and metrics
    launches: int = 0
    started_at: float | None = None  # when the current launch began
    last_progress_at: float | None = None
    deadline: float | None = None  # backoff: when to try again
    last_failure: Failure | None = None
    pending: Failure | None = None  # the failure the current stop answers
    after_stop: After = After.stay_stopped
    health_note: str | None = None  # why degraded
    restart_reason: str | None = None  # why the next launch is a restart: a failure class, "operator", "reset"
    restart_state: policy.RestartState = field(default_factory=policy.RestartState)

    @property
    def breaker_open(self) -> bool:
        return self.restart_state.breaker_open


Result = tuple[Machine, list[Action]]


def _to(m: Machine, state: State, now: float, **changes: object) -> Machine:
    return replace(m, state=state, since=now, **changes)  # type: ignore[arg-type]


def _preflight(m: Machine, now: float) -> Result:
    return _to(m, State.preflight, now, deadline=None, pending=None, health_note=None), [RunPreflight()]


def _stop(m: Machine, now: float, after: After, reason: str, failure: Failure | None = None) -> Result:
    actions: list[Action] = [Stop(reason)]
    if failure is not None:
        actions.insert(0, RecordIncident(failure))
    changes: dict[str, object] = {"after_stop": after, "pending": failure, "health_note": None}
    if failure is not None:
        changes["last_failure"] = failure
    return _to(m, State.stopping, now, **changes), actions


def step(m: Machine, obs: Observation, now: float, limits: Limits | None = None) -> Result:
    """The next machine and the actions to carry out, for observation ``obs`` at monotonic ``now``."""
    limits = limits or Limits()
    state = m.state
    if isinstance(obs, StopRequested):
        m = replace(m, want_running=False)
        if state in RUNNING:
            return _stop(m, now, After.stay_stopped, "operator stop")
        if state is State.stopping:
            return replace(m, after_stop=After.stay_stopped if m.pending is None else m.after_stop), []
        return _to(m, State.stopped, now, deadline=None), []
    if isinstance(obs, RestartRequested):
        m = replace(m, want_running=True, restart_state=policy.reset(m.restart_state), restart_reason="operator")
        if state in RUNNING:
            return _stop(m, now, After.restart, "operator restart")
        if state is State.stopping:
            return replace(m, after_stop=After.restart, pending=None), []
        if state is State.preflight:
            return m, []
        return _preflight(m, now)
    if isinstance(obs, ResetRequested):
        m = replace(m, restart_state=policy.reset(m.restart_state), restart_reason="reset")
        if state is not State.failed:
            return m, []
        return _preflight(m, now) if m.want_running else (_to(m, State.stopped, now), [])
    if isinstance(obs, StartRequested):
        m = replace(m, want_running=True)
        if state is State.stopped:
            return _preflight(replace(m, restart_reason="operator"), now)
        if state is State.backoff:
            return _preflight(m, now)
        return m, []  # running already, or failed (only reset/restart clear the breaker)
    return _lifecycle(m, obs, now, limits)


def _lifecycle(m: Machine, obs: Observation, now: float, limits: Limits) -> Result:
    state = m.state
    if state is State.adopting and isinstance(obs, Adopted):
        if obs.found:
            return _to(m, State.starting, now, started_at=now, last_progress_at=now), []
        if limits.led:
            return _to(m, State.stopped, now, want_running=False), []
        return _preflight(m, now) if m.want_running else (_to(m, State.stopped, now), [])
    if state is State.preflight and isinstance(obs, PreflightDone):
        if obs.failure is None:
            restarts = m.restarts + (1 if m.launches else 0)
            return _to(m, State.starting, now, started_at=now, last_progress_at=now,
                       launches=m.launches + 1, restarts=restarts), [Launch()]
        return _recover_now(m, obs.failure, now, limits)
    if state is State.starting:
        return _starting(m, obs, now, limits)
    if state in SERVING:
        return _serving(m, obs, now)
    if state is State.stopping and isinstance(obs, StopDone):
        return _after_stop(m, obs, now, limits)
    if state is State.backoff and isinstance(obs, Tick) and m.deadline is not None and now >= m.deadline:
        return _preflight(m, now)
    return m, []


def _recover_now(m: Machine, failure: Failure, now: float, limits: Limits) -> Result:
    """A start that failed before any process existed (preflight): back off, wait, or give up."""
    actions: list[Action] = [RecordIncident(failure)]
    m = replace(m, last_failure=failure, pending=None)
    if limits.led:
        return _to(m, State.stopped, now, want_running=False), actions
    if failure.cls is FailureClass.peer_lost:
        restart_state, wait = policy.on_wait(m.restart_state, limits.restart, 0.5)
        return _to(m, State.backoff, now, restart_state=restart_state, deadline=now + wait.delay_s,
                   restart_reason=failure.cls.value), actions
    restart_state, decision = policy.on_failure(m.restart_state, limits.restart, failure.cls, now, 0.5)
    m = replace(m, restart_state=restart_state)
    if isinstance(decision, policy.GiveUp):
        return _to(m, State.failed, now, deadline=None), actions
    return _to(m, State.backoff, now, deadline=now + decision.delay_s, restart_reason=failure.cls.value), actions


def _starting(m: Machine, obs: Observation, now: float, limits: Limits) -> Result:
    if isinstance(obs, Progress):
        return replace(m, last_progress_at=now), []
    if isinstance(obs, BecameReady):
        return _to(m, State.ready, now, restart_state=policy.on_ready(m.restart_state, now)), []
    if isinstance(obs, LaunchFailed):
        return _stop(m, now, After.recover, "launch failed", obs.failure)
    if isinstance(obs, Exited | HealthFailed):
        return _stop(m, now, After.recover, "exited during startup", obs.failure)
    if isinstance(obs, Tick):
        started = m.started_at if m.started_at is not None else now
        silent_since = m.last_progress_at if m.last_progress_at is not None else started
        if now - started >= limits.startup_timeout_s and now - silent_since >= limits.startup_extension_s:
            return _stop(m, now, After.recover, "startup budget spent",
                         startup_hang(f"not ready after {now - started:.0f} s (startup budget "
                                      f"{limits.startup_timeout_s:.0f} s)"))
        if now - silent_since >= limits.startup_silence_s:
            return _stop(m, now, After.recover, "startup silent",
                         startup_hang(f"no startup progress in the log for {now - silent_since:.0f} s"))
    return m, []


def startup_hang(what: str) -> Failure:
    return Failure(
        cls=FailureClass.hang, exit_code=None, signal=None, evidence=None,
        sentence=f"vLLM stalled during startup: {what}; sparkd stopped it and will retry with backoff.",
    )


def _serving(m: Machine, obs: Observation, now: float) -> Result:
    if isinstance(obs, HealthDegraded):
        if m.state is State.ready:
            return _to(m, State.degraded, now, health_note=obs.reason), []
        return replace(m, health_note=obs.reason), []
    if isinstance(obs, HealthRecovered) and m.state is State.degraded:
        return _to(m, State.ready, now, health_note=None), []
    if isinstance(obs, HealthFailed | Exited):
        return _stop(m, now, After.recover, "health failed" if isinstance(obs, HealthFailed) else "exited",
                     obs.failure)
    return m, []


def _after_stop(m: Machine, obs: StopDone, now: float, limits: Limits) -> Result:
    restart_state = policy.on_stopped(m.restart_state)
    m = replace(m, restart_state=restart_state)
    if m.after_stop is After.recover and m.pending is not None and limits.led:
        return _to(m, State.stopped, now, deadline=None, pending=None, want_running=False), []
    if m.after_stop is After.recover and m.pending is not None:
        failed = m.pending
        restart_state, decision = policy.on_failure(m.restart_state, limits.restart, m.pending.cls, now,
                                                    obs.rand)
        m = replace(m, restart_state=restart_state, pending=None)
        if isinstance(decision, policy.GiveUp):
            return _to(m, State.failed, now, deadline=None), []
        if not m.want_running:
            return _to(m, State.stopped, now, deadline=None), []
        return _to(m, State.backoff, now, deadline=now + decision.delay_s, restart_reason=failed.cls.value), []
    if m.after_stop is After.restart and m.want_running:
        return _preflight(replace(m, restart_reason="operator"), now)
    return _to(m, State.stopped, now, deadline=None, pending=None), []
