"""How the lifecycle's machine moves: the steps every edge handler of :mod:`sparkd.supervisor.lifecycle` is made of
— into a state (clearing what belongs to the one it leaves), into preflight, into a stop that knows what follows it,
into the breaker, and the recovery after a failure (wait, back off or open the breaker). Pure, as the table is."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sparkd.supervisor import policy
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Budget, Failure, FailureClass
from sparkd.supervisor.repeat import comparable
from sparkd.supervisor.states import SERVING, After, Intent, Limits, Machine, State

Result = tuple[Machine, list[v.Action]]


def to(m: Machine, state: State, now: float, **changes: Any) -> Machine:
    if state is not State.stopping:
        changes.setdefault("after", None)
        changes.setdefault("answering", None)
    if state is not State.failed:
        changes.setdefault("breaker_reason", None)
    if state is not State.backoff:
        changes.setdefault("deadline", None)
    return replace(m, state=state, since=now, **changes)


def preflight(m: Machine, now: float, **changes: Any) -> Result:
    return to(m, State.preflight, now, health_note=None, **changes), [v.RunPreflight()]


def stop(m: Machine, now: float, after: After, reason: str, *, failure: Failure | None = None,
         grace_s: float | None = None, recorded: bool = False, hung: bool = False,
         skip_drain: bool = False) -> Result:
    actions: list[v.Action] = []
    changes: dict[str, Any] = {"after": after, "answering": failure, "health_note": None}
    if failure is not None:
        actions.append(v.RecordIncident(failure, written=recorded))
        changes["last_failure"] = failure
    actions.append(v.Stop(reason, grace_s, failure, hung, now=skip_drain, serving=m.state in SERVING))
    return to(m, State.stopping, now, **changes), actions


def cut(obs: v.StopRequested | v.RestartRequested) -> list[v.Action]:
    """An operator's ``--now`` while a stop runs: its drain is cut short."""
    return [v.CutStop()] if obs.now else []


def give_up(m: Machine, now: float, reason: str) -> Result:
    return to(m, State.failed, now, breaker_reason=reason), []


def recover(m: Machine, failure: Failure, now: float, rand: float, limits: Limits) -> Result:
    """After a failure, with no instance left: wait, back off, or open the breaker."""
    if failure.treatment.budget is Budget.none:
        state, wait = policy.on_wait(m.restart_state, limits.restart, now, rand)
        return to(m, State.backoff, now, restart_state=state, deadline=now + wait.delay_s,
                  restart_reason=failure.cls.value), []
    state, decision = policy.on_failure(m.restart_state, limits.restart, failure.cls, now, rand, comparable(failure))
    m = replace(m, restart_state=state)
    if isinstance(decision, policy.GiveUp):
        return give_up(m, now, decision.reason)
    if m.intent is Intent.stop:
        return to(m, State.stopped, now), []
    return to(m, State.backoff, now, deadline=now + decision.delay_s, restart_reason=failure.cls.value), []


def startup_hang(what: str) -> Failure:
    return Failure.of(FailureClass.hang,
                      f"vLLM stalled during startup: {what}; sparkd stopped it and will retry with backoff.")
