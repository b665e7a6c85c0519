"""The node's side of the memory guard: the hooks it acts through, and its start gate.

The guard samples and decides (``sparkd.guard``); these hooks turn its decisions into the lifecycle's
vocabulary. A guard stop or kill is a classified failure (``killed_by_guard``) whose evidence the guard wrote
before any signal, so it travels as ``HealthFailed(failure, grace_s=…, recorded=True)``: the grace rides on the
stop, and the incident is recorded once by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkd.daemon.loop.nodestate import NodeState
from sparkd.guard.guard import Guard
from sparkd.guard.policy import Decision
from sparkd.host.logs import Logger
from sparkd.runtime.base import Runtime
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.readings import VllmMetrics
from sparkd.supervisor.states import State

# (the guard's failure, the guard's own evidence, the node's state when it acts)
WriteEvidence = Callable[[Failure, dict[str, Any], NodeState], None]


class NodeGuardHooks:
    """Built before the guard, from what exists before it: the node's state now, the runtime, the watch's last
    metrics, the evidence writer, the mailbox."""

    def __init__(self, node: Callable[[], NodeState], runtime: Runtime, metrics: Callable[[], VllmMetrics | None],
                 write: WriteEvidence, post: Callable[[v.Observation], None], log: Logger, *,
                 tell: Callable[[Decision], None] | None = None) -> None:
        """``tell``: who hears each decision the guard publishes (the webhooks, issue 40)."""
        self.node = node
        self.runtime = runtime
        self.metrics = metrics
        self.write = write
        self.post = post
        self.log = log
        self.tell = tell

    def vllm_pids(self) -> set[int]:
        instance = self.node().instance
        return self.runtime.pids(instance) if instance is not None else set()

    def starting(self) -> bool:
        return self.node().state in (State.preflight, State.starting)

    def idle(self) -> bool | None:
        metrics = self.metrics()
        return None if metrics is None else metrics.num_requests_running <= 0

    def on_decision(self, decision: Decision) -> None:
        """The guard logs its own decisions (once each); status and metrics read them from the guard; ``tell``
        hears each."""
        if self.tell is not None:
            self.tell(decision)

    def write_evidence(self, failure: Failure, evidence: dict[str, Any]) -> None:
        self.write(failure, evidence, self.node())

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
