"""The node's side of the memory guard: the hooks it acts through, and its start gate.

The guard samples and decides (``sparkd.guard``); these hooks turn its decisions into the lifecycle's
vocabulary. A guard stop or kill is a classified failure (``killed_by_guard``) whose evidence the guard wrote
before any signal, so it travels as ``HealthFailed(failure, grace_s=…, recorded=True)``: the grace rides on the
stop, and the incident is recorded once by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkd.daemon.effects.slot import InstanceSlot
from sparkd.guard.guard import Guard
from sparkd.guard.policy import Decision
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import State

WriteEvidence = Callable[[Failure, dict[str, Any]], None]  # (the guard's failure, the guard's own evidence)


class NodeGuardHooks:
    """Built before the guard, from what exists before it: the instance slot, the evidence writer, the mailbox."""

    def __init__(self, slot: InstanceSlot, write: WriteEvidence, post: Callable[[v.Observation], None],
                 state: Callable[[], State], log: Any) -> None:
        self.slot = slot
        self.write = write
        self.post = post
        self.state = state
        self.log = log

    def vllm_pids(self) -> set[int]:
        return self.slot.pids()

    def starting(self) -> bool:
        return self.state() in (State.preflight, State.starting)

    def idle(self) -> bool | None:
        metrics = self.slot.metrics()
        return None if metrics is None else metrics.num_requests_running <= 0

    def on_decision(self, decision: Decision) -> None:
        """The guard logs its own decisions (once each); status and metrics read them from the guard."""

    def write_evidence(self, failure: Failure, evidence: dict[str, Any]) -> None:
        self.write(failure, evidence)

    async def stop_vllm(self, failure: Failure, grace_s: float) -> None:
        self.post(v.HealthFailed(failure, grace_s=grace_s, recorded=True))

    async def kill_vllm(self, failure: Failure) -> None:
        self.post(v.HealthFailed(failure, grace_s=0.0, recorded=True))

    async def planned_restart(self, reason: str) -> None:
        self.log.warning("guard_planned_restart", reason=reason)
        self.post(v.RestartRequested())


def start_refusal(guard: Guard | None) -> Failure | None:
    """The guard's start gate as a preflight failure: a start waits for headroom with backoff. A wait, not a
    failure (``host_unavailable``: no restart budget spent, no step toward the breaker): vLLM never ran, and
    the gate is closed by the guard's own cool-down after every stop it makes."""
    if guard is None or guard.start_allowed or guard.decision is None:
        return None
    return Failure.of(FailureClass.host_unavailable, f"The memory guard refuses a start: {guard.decision.reason}; "
                      "sparkd waits for headroom and tries again with backoff, without spending the restart budget.")
