"""The lifecycle state machine: a pure function of (machine, observation, monotonic time), written as a table.

``step`` looks up ``(state, type of observation)`` in :data:`TABLE` and runs that edge's handler, which returns
the next machine and the actions the shell must carry out. Every pair not in the table is listed in
:data:`IGNORED` — a late exit of an instance already being stopped, a probe result after a stop — and comes
back with ``edge=None`` so the shell can log it. A test holds the two together: every pair is in exactly one.
No clock, no I/O, no random numbers (jitter rides on the observation).

Rules:

1. ``failed`` is the open restart breaker, and its only representation. Only ``reset`` and ``restart`` leave
   it; ``stop`` records the intent and stays failed, ``start`` is refused (``states.refusal``).
2. The operator's ``intent`` (run or stop) is explicit and outlives the daemon (``states.Remembered``): after
   ``sparkctl stop`` a restarted daemon leaves vLLM stopped. A daemon shutdown (SIGTERM) stops vLLM but leaves
   the intent as it was.
3. A stop always knows what follows it (``After``): stay stopped, restart at once, or recover from the failure
   it answers (backoff, a wait that spends no budget, or the breaker).
4. How a failure is treated — restartable, its budget weight, waiting instead of failing — comes from the one
   failure table (``sparkd.supervisor.failures``) through the restart policy.
5. A led rank (a worker of a group) never restarts on its own: after a failure it stops and waits for its head.
6. While adopting, only the boot result is taken; the shell holds operator commands and signals until then.
7. The acceptance gate (issue 37, ``Limits.accept_s``): a launch's ``BecameReady`` leads to ``accepting``, where the
   gate runs (``RunGate``) under its budget; with no gate (off, or a led rank: the head's speaks for the group)
   ``ready``. An adopted instance served before sparkd came: ``ready`` at once, its answers replayed beside it.
8. ``GateDone`` in ``accepting``: a refusal stays there — vLLM running and watched, not ready, no deadline, never a
   restart (the same launch answers the same); ``sparkctl accept``, a restart or a stop leave it. A warning serves
   ``degraded`` with the sentence; a pass or an unfinished gate, ``ready``; its budget spent (``Tick``), ``ready``.
   An adopted instance's refusal holds it there too.
9. While serving, a replay (``ReplayDue``: idle at the interval, after a wake) or an accept never stops vLLM: a wrong
   or lost verdict is ``degraded`` and stands (a replay that passes does not clear it) until an accept passes or a
   restart. A gate's failure is recorded once.
10. A wedge named while a stop waits on vLLM's drain (the step probe reads on while it drains) cuts the drain
    (``CutStop``): a wedged engine finishes none of its requests, so the drain would only spend its whole timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from sparkd.supervisor import policy
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import wedged
from sparkd.supervisor.moves import Result, startup_hang
from sparkd.supervisor.moves import cut as _cut
from sparkd.supervisor.moves import give_up as _give_up
from sparkd.supervisor.moves import preflight as _preflight
from sparkd.supervisor.moves import recover as _recover
from sparkd.supervisor.moves import stop as _stop
from sparkd.supervisor.moves import to as _to
from sparkd.supervisor.states import RUNNING, SERVING, After, Intent, Limits, Machine, State

__all__ = ["IGNORED", "TABLE", "Edge", "Step", "startup_hang", "step"]


class Step(NamedTuple):
    machine: Machine
    actions: list[v.Action]
    edge: str | None  # "ready → stopping: the instance failed"; None: the pair is ignored


Handler = Callable[[Machine, Any, float, Limits], Result]


@dataclass(frozen=True)
class Edge:
    to: frozenset[State]  # where this edge may lead
    why: str
    handler: Handler


# ---- the handlers, one per edge --------------------------------------------------------------------------
def _boot(m: Machine, obs: v.Adopted, now: float, limits: Limits) -> Result:
    if obs.found:
        if m.intent is Intent.stop:
            return _stop(_to(m, State.starting, now), now, After.stay, "operator stop (remembered)")
        return _to(m, State.starting, now, started_at=now, last_progress_at=now), []
    if limits.led:
        return _to(m, State.stopped, now), []
    if m.breaker_reason is not None:
        return _give_up(m, now, m.breaker_reason)
    if m.intent is Intent.stop:
        return _to(m, State.stopped, now), []
    if m.deadline is not None and m.deadline > now:
        return _to(m, State.backoff, now, deadline=m.deadline), []
    return _preflight(m, now)


def _start(m: Machine, obs: v.StartRequested, now: float, limits: Limits) -> Result:
    reason = "operator" if m.state is State.stopped else m.restart_reason
    return _preflight(replace(m, intent=Intent.run), now, restart_reason=reason)


def _start_after_stop(m: Machine, obs: v.StartRequested, now: float, limits: Limits) -> Result:
    after = After.restart if m.after is After.stay else m.after
    return replace(m, intent=Intent.run, after=after), []


def _stop_request(m: Machine, obs: v.StopRequested, now: float, limits: Limits) -> Result:
    m = replace(m, intent=Intent.stop)
    if m.state in RUNNING:
        return _stop(m, now, After.stay, "operator stop", skip_drain=obs.now)
    if m.state is State.stopping:
        return replace(m, after=After.recover if m.after is After.recover else After.stay), _cut(obs)
    if m.state is State.failed:
        return m, []
    return _to(m, State.stopped, now), []


def _shutdown(m: Machine, obs: v.ShutdownRequested, now: float, limits: Limits) -> Result:
    if m.state in RUNNING:
        return _stop(m, now, After.stay, "sparkd shutting down")
    if m.state is State.stopping:
        return replace(m, after=After.recover if m.after is After.recover else After.stay), []
    return _to(m, State.stopped, now), []


def _restart(m: Machine, obs: v.RestartRequested, now: float, limits: Limits) -> Result:
    m = replace(m, intent=Intent.run, restart_state=policy.reset(m.restart_state), restart_reason="operator")
    if m.state in RUNNING:
        return _stop(m, now, After.restart, "operator restart", skip_drain=obs.now)
    if m.state is State.stopping:
        return replace(m, after=After.restart, answering=None), _cut(obs)
    if m.state is State.preflight:
        return m, []
    return _preflight(m, now)


def _reset(m: Machine, obs: v.ResetRequested, now: float, limits: Limits) -> Result:
    m = replace(m, restart_state=policy.reset(m.restart_state), restart_reason="reset")
    if m.state is not State.failed:
        return m, []
    if m.intent is Intent.run and not limits.led:
        return _preflight(m, now)
    return _to(m, State.stopped, now), []


def _preflight_done(m: Machine, obs: v.PreflightDone, now: float, limits: Limits) -> Result:
    if obs.failure is None:
        restarts = m.restarts + (1 if m.launches else 0)
        return _to(m, State.starting, now, started_at=now, last_progress_at=now, launches=m.launches + 1,
                   restarts=restarts), [v.Launch()]
    m = replace(m, last_failure=obs.failure)
    actions: list[v.Action] = [v.RecordIncident(obs.failure)]
    if limits.led:
        return _to(m, State.stopped, now), actions
    m, more = _recover(m, obs.failure, now, obs.rand, limits)
    return m, actions + more


def _progress(m: Machine, obs: v.Progress, now: float, limits: Limits) -> Result:
    return replace(m, last_progress_at=now), []


def _became_ready(m: Machine, obs: v.BecameReady, now: float, limits: Limits) -> Result:
    if limits.accept_s is None:
        return _ready(m, now), []
    if m.launches == 0:  # adopted at boot: it served before this daemon came, and serves on while it is asked
        return _ready(m, now), [v.RunGate("adopted", "adopted at boot")]
    return _to(m, State.accepting, now, deadline=now + limits.accept_s), [v.RunGate("start")]


def _ready(m: Machine, now: float, state: State = State.ready, **changes: Any) -> Machine:
    return _to(m, state, now, restart_state=policy.on_ready(m.restart_state, now), **changes)


def _gate_done(m: Machine, obs: v.GateDone, now: float, limits: Limits) -> Result:
    """Rules 8 and 9: nothing here stops vLLM."""
    result, failure = obs.result, obs.result.failure
    new = failure is not None and (m.last_failure is None or (m.last_failure.cls, m.last_failure.sentence)
                                   != (failure.cls, failure.sentence))
    actions: list[v.Action] = [v.RecordIncident(failure)] if new and failure is not None else []
    changes: dict[str, Any] = {"last_failure": failure} if new else {}
    stays = m.since if m.state is State.accepting else now
    if result.refuse and (m.state is State.accepting or obs.kind == "adopted"):  # a start's refusal holds
        return _to(m, State.accepting, stays, **changes), actions
    if m.state is State.accepting:
        state = State.degraded if failure is not None else State.ready
        return _ready(m, now, state, health_note=result.sentence if failure else None, **changes), actions
    if failure is not None:
        return _to(m, State.degraded, now if m.state is State.ready else m.since, health_note=result.sentence,
                   **changes), actions
    said = m.last_failure is not None and m.health_note == m.last_failure.sentence
    if m.state is State.degraded and said and obs.kind == "accept":  # what a gate said: an accept clears it
        return _to(m, State.ready, now, health_note=None), []
    return m, []


def _gate_deadline(m: Machine, obs: v.Tick, now: float, limits: Limits) -> Result:
    return (_ready(m, now) if m.deadline is not None and now >= m.deadline else m), []


def _replay(m: Machine, obs: v.ReplayDue, now: float, limits: Limits) -> Result:
    return m, [] if limits.accept_s is None else [v.RunGate("wake" if obs.wake else "replay", obs.why)]


def _failed_while_running(m: Machine, obs: v.Exited | v.HealthFailed | v.LaunchFailed, now: float,
                          limits: Limits) -> Result:
    reason = {v.Exited: "exited", v.HealthFailed: "health failed", v.LaunchFailed: "launch failed"}[type(obs)]
    if m.state is State.starting and isinstance(obs, v.Exited):
        reason = "exited during startup"
    grace = obs.grace_s if isinstance(obs, v.HealthFailed) else None
    recorded = obs.recorded if isinstance(obs, v.HealthFailed) else False
    hung = obs.hung if isinstance(obs, v.HealthFailed) else False
    return _stop(m, now, After.recover, reason, failure=obs.failure, grace_s=grace, recorded=recorded, hung=hung)


def _startup_deadline(m: Machine, obs: v.Tick, now: float, limits: Limits) -> Result:
    started = m.started_at if m.started_at is not None else now
    silent_since = m.last_progress_at if m.last_progress_at is not None else started
    if now - started >= limits.startup_timeout_s and now - silent_since >= limits.startup_extension_s:
        return _stop(m, now, After.recover, "startup budget spent", failure=startup_hang(
            f"not ready after {now - started:.0f} s (startup budget {limits.startup_timeout_s:.0f} s)"))
    if now - silent_since >= limits.startup_silence_s:
        return _stop(m, now, After.recover, "startup silent", failure=startup_hang(
            f"no startup progress in the log for {now - silent_since:.0f} s"))
    return m, []


def _degraded(m: Machine, obs: v.HealthDegraded, now: float, limits: Limits) -> Result:
    if m.state is State.ready:
        return _to(m, State.degraded, now, health_note=obs.reason), []
    return replace(m, health_note=obs.reason), []


def _recovered(m: Machine, obs: v.HealthRecovered, now: float, limits: Limits) -> Result:
    return _to(m, State.ready, now, health_note=None), []


def _stop_done(m: Machine, obs: v.StopDone, now: float, limits: Limits) -> Result:
    if m.after is After.recover and m.answering is not None and not limits.led:
        return _recover(m, m.answering, now, obs.rand, limits)  # the policy sees how long the run was ready
    m = replace(m, restart_state=policy.on_stopped(m.restart_state))
    if m.after is After.recover and m.answering is not None:
        return _to(m, State.stopped, now), []
    if m.after is After.restart and m.intent is Intent.run:
        return _preflight(m, now, restart_reason="operator")
    return _to(m, State.stopped, now), []


def _backoff_over(m: Machine, obs: v.Tick, now: float, limits: Limits) -> Result:
    if m.deadline is not None and now >= m.deadline:
        return _preflight(m, now)
    return m, []


def _leave_failed(m: Machine, obs: v.ResetRequested | v.RestartRequested, now: float, limits: Limits) -> Result:
    return _reset(m, obs, now, limits) if isinstance(obs, v.ResetRequested) else _restart(m, obs, now, limits)


def _wedged_while_stopping(m: Machine, obs: v.HealthFailed, now: float, limits: Limits) -> Result:
    """Rule 10."""
    failure = obs.failure
    return m, [v.CutStop(f"vLLM is wedged: {failure.evidence or failure.sentence}")] if wedged(failure) else []


def _stop_while_failed(m: Machine, obs: v.StopRequested, now: float, limits: Limits) -> Result:
    return replace(m, intent=Intent.stop), []


# ---- the table -------------------------------------------------------------------------------------------

S = State
_ANY_BUT_ADOPTING = tuple(s for s in State if s is not S.adopting)
_RUNNING = (S.starting, S.accepting, S.ready, S.degraded)

TABLE: dict[tuple[State, type], Edge] = {}
IGNORED: dict[tuple[State, type], str] = {}


def _on(states: tuple[State, ...], observations: tuple[type, ...], to: tuple[State, ...], why: str,
        handler: Handler) -> None:
    for state in states:
        for obs in observations:
            assert (state, obs) not in TABLE, (state, obs)
            TABLE[(state, obs)] = Edge(frozenset(to), why, handler)


def _ignore(states: tuple[State, ...], observations: tuple[type, ...], why: str) -> None:
    for state in states:
        for obs in observations:
            if (state, obs) not in TABLE and (state, obs) not in IGNORED:
                IGNORED[(state, obs)] = why


# boot
_on((S.adopting,), (v.Adopted,), (S.starting, S.stopping, S.stopped, S.failed, S.backoff, S.preflight),
    "the boot-time search is over", _boot)
# the operator
_on((S.stopped, S.backoff), (v.StartRequested,), (S.preflight,), "operator start", _start)
_on((S.stopping,), (v.StartRequested,), (S.stopping,), "start once the stop is done", _start_after_stop)
_on(_RUNNING, (v.StopRequested,), (S.stopping,), "operator stop", _stop_request)
_on((S.stopping,), (v.StopRequested,), (S.stopping,), "stay stopped once the stop is done", _stop_request)
_on((S.preflight, S.backoff, S.stopped), (v.StopRequested,), (S.stopped,), "operator stop", _stop_request)
_on((S.failed,), (v.StopRequested,), (S.failed,), "stop: the breaker stays open", _stop_while_failed)
_on(_RUNNING, (v.RestartRequested,), (S.stopping,), "operator restart", _restart)
_on((S.stopping,), (v.RestartRequested,), (S.stopping,), "restart once the stop is done", _restart)
_on((S.preflight,), (v.RestartRequested,), (S.preflight,), "restart forgets the failures; preflight goes on",
    _restart)
_on((S.stopped, S.backoff), (v.RestartRequested,), (S.preflight,), "operator restart", _restart)
_on((S.failed,), (v.RestartRequested, v.ResetRequested), (S.preflight, S.stopped), "the breaker is closed",
    _leave_failed)
for _state in _ANY_BUT_ADOPTING:
    if _state is not S.failed:
        _on((_state,), (v.ResetRequested,), (_state,), "reset forgets the failures", _reset)
_on(_RUNNING, (v.ShutdownRequested,), (S.stopping,), "sparkd is shutting down", _shutdown)
_on((S.stopping,), (v.ShutdownRequested,), (S.stopping,), "stay stopped: sparkd is shutting down", _shutdown)
_on((S.preflight,), (v.ShutdownRequested,), (S.stopped,), "sparkd is shutting down", _shutdown)
# the lifecycle
_on((S.preflight,), (v.PreflightDone,), (S.starting, S.backoff, S.failed, S.stopped), "preflight done",
    _preflight_done)
_on((S.starting,), (v.Progress,), (S.starting,), "startup progress", _progress)
_on((S.starting,), (v.BecameReady,), (S.accepting, S.ready), "ready: the acceptance gate, where it runs",
    _became_ready)
_on((S.starting,), (v.Tick,), (S.starting, S.stopping), "startup deadlines", _startup_deadline)
_on((S.starting,), (v.LaunchFailed,), (S.stopping,), "the launch failed", _failed_while_running)
_on(_RUNNING, (v.Exited, v.HealthFailed), (S.stopping,), "the instance failed", _failed_while_running)
_on((S.ready, S.degraded), (v.HealthDegraded,), (S.degraded,), "health degraded", _degraded)
_on((S.degraded,), (v.HealthRecovered,), (S.ready,), "health recovered", _recovered)
_on((S.stopping,), (v.HealthFailed,), (S.stopping,), "a wedge while the stop drains: the drain is cut",
    _wedged_while_stopping)
_on((S.stopping,), (v.StopDone,), (S.stopped, S.preflight, S.backoff, S.failed), "the stop is done", _stop_done)
_on((S.backoff,), (v.Tick,), (S.backoff, S.preflight), "backoff deadline", _backoff_over)
# the acceptance gate (rules 7 to 9)
_on((S.accepting,), (v.GateDone,), (S.accepting, S.ready, S.degraded),
    "the gate's verdict: a refusal holds, a warning serves degraded", _gate_done)
_on(tuple(SERVING), (v.GateDone,), (S.ready, S.degraded, S.accepting),
    "a verdict while serving: degraded (an adopted one's refusal holds), never stopped", _gate_done)
_on((S.accepting,), (v.Tick,), (S.accepting, S.ready), "the gate's budget", _gate_deadline)
_on((S.accepting,), (v.HealthDegraded,), (S.accepting,), "health degraded: noted, the gate decides", _degraded)
_on(tuple(SERVING), (v.ReplayDue,), (S.ready, S.degraded), "replay the answers beside the users", _replay)

# Everything else is ignored, for the reason given.
_ignore((S.adopting,), v.OBSERVATIONS, "still adopting: the shell holds commands and signals until the boot "
        "result")
_ignore((S.accepting,), (v.BecameReady, v.Progress, v.HealthRecovered),
        "the acceptance gate, not health, decides when this start is ready")
_ignore(tuple(State), (v.ReplayDue,), "no replay: vLLM does not serve, or its start's gate runs")
_ignore(tuple(State), (v.Tick,), "no deadline in this state")
_ignore(tuple(State), (v.StartRequested,), "vLLM is running or starting already, or the breaker is open")
_ignore(tuple(State), (v.ShutdownRequested,), "nothing of vLLM's runs")
_ignore(tuple(State), (v.Exited, v.HealthFailed, v.HealthDegraded, v.HealthRecovered, v.Progress, v.BecameReady,
                       v.LaunchFailed, v.Launched),
        "a report about an instance that is not (or no longer) watched in this state")
_ignore(tuple(State), (v.PreflightDone, v.StopDone, v.Adopted, v.GateDone),
        "the effect it reports is not awaited now")


# ---- stepping ------------------------------------------------------------------------------------------
def step(m: Machine, obs: v.Observation, now: float, limits: Limits | None = None) -> Step:
    """The next machine, the actions to carry out, and the edge taken, for ``obs`` at monotonic ``now``."""
    edge = TABLE.get((m.state, type(obs)))
    if edge is None:
        return Step(m, [], None)
    after, actions = edge.handler(m, obs, now, limits or Limits())
    return Step(after, actions, f"{m.state.value} → {after.state.value}: {edge.why}")
