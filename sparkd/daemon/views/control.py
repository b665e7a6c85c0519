"""The daemon's surface for the control commands (``sparkd.commands.port.Control``), over the loop, the view and what
the operator reaches beside the loop (vLLM's log, the preflight, the container, the group's checks). Commands post
observations and read status here; they never reach further in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.commands.port import Acceptance
from sparkd.commands.statusdoc import Status
from sparkd.config import Role
from sparkd.daemon.boot.reload import ReloadReport
from sparkd.daemon.effects.accepting import AcceptanceGate
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.preflighting import LocalPreflight
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.daemon.views.flightrecords import flight_records
from sparkd.daemon.views.status import StatusView
from sparkd.daemon.watch.steps import StepSense
from sparkd.host.logs import VllmLog
from sparkd.preflight.runner import PreflightReport
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.standing import GateKind
from sparkd.supervisor.graces import stop_wait_s
from sparkd.supervisor.states import State, refusal

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

FOLLOW_BUFFER = 10_000  # lines a slow `sparkctl logs -f` may fall behind before it misses some


@dataclass(frozen=True)
class Operated:
    """What the operator's commands reach beside the loop, each read-only but for what it does itself."""

    vllm_log: VllmLog  # its tail, its lines since, a follow
    preflight: LocalPreflight  # an operator's (or the head's) preflight, and the last one's results
    container: ContainerFacts  # `sparkctl recreate`
    plan: LaunchPlan  # this node's vLLM left after a stop
    checks: GroupChecks  # the group's proofs, a worker's answers to them
    acceptance: AcceptanceGate  # `sparkctl accept`: the gate run now, its answers the golden
    steps: StepSense | None = None  # this node's step records (a worker's answer to its head)


class DaemonControl:
    def __init__(self, sup: Supervisor, view: StatusView, operated: Operated, group: Coordinator | None, *,
                 reload: Callable[[], Awaitable[ReloadReport]], handover: Callable[[], None]) -> None:
        self.sup = sup
        self.view = view
        self.operated = operated
        self.checks = operated.checks
        self.group = group
        self.worker = group is not None and group.role is Role.worker
        self.incidents_root: Path = sup.config().paths.incidents
        self._reload = reload
        self._handover = handover
        self._changed = anyio.Event()

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """The node changed: whoever waits for a change looks again."""
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def stop_timeout_s(self) -> float:
        """How long a rank's stop may take: the drain of the instance running now, its grace and a margin."""
        instance = self.sup.instance()
        return stop_wait_s(self.sup.config(), instance.drain_s if instance is not None else None)

    def status(self) -> Status:
        return self.view.status()

    def steps(self) -> dict[str, Any]:
        sense = self.operated.steps
        if sense is None:
            return {"node": self.sup.config().node.name, "read_at_ns": 0, "records": [], "states": [],
                    "problems": ["this sparkd reads no step records"]}
        return sense.answer()

    async def reload(self) -> ReloadReport:
        return await self._reload()

    def handover(self) -> None:
        self._handover()

    async def recreate(self) -> tuple[bool, str]:
        return await self.operated.container.recreate()

    @property
    def acceptance(self) -> Acceptance | None:
        """`sparkctl accept`'s port (:meth:`accept`) while ``[acceptance]`` is on."""
        return self if self.sup.config().acceptance.enabled else None

    async def accept(self) -> dict[str, Any]:
        """The gate against the running vLLM now, its answers recorded as the golden; its verdict reaches the loop
        (a pass lets a start the gate held be ready) before the answer."""
        result = await self.operated.acceptance.gate(self.sup.node(), GateKind.accept)
        if result is None:
            return {"verdict": "incomplete", "sentence": "vLLM stopped while its answers were asked; nothing was "
                    "recorded.", "refuse": False, "seconds": 0.0, "parts": [], "class": None}
        await self.sup.submit(v.GateDone(result, GateKind.accept.value))
        return result.to_json()

    def refusal(self, command: str) -> str | None:
        if self.sup.shutting_down:
            return "sparkd is shutting down"
        return refusal(self.sup.machine, command)

    async def submit(self, obs: v.Observation) -> None:
        await self.sup.submit(obs)

    async def settle(self, done: Callable[[], bool], timeout_s: float) -> bool:
        with anyio.move_on_after(timeout_s):
            while not done():
                await self._changed.wait()
            return True
        return done()

    def running(self) -> bool:
        return self.sup.instance() is not None

    def stopped(self) -> bool:
        return self.sup.instance() is None and self.sup.machine.state in (State.stopped, State.failed)

    def _protected(self) -> frozenset[int]:
        """The watched instance's processes: an operator's question never touches them."""
        instance = self.sup.instance()
        return frozenset(self.operated.plan.runtime.pids(instance)) if instance is not None else frozenset()

    def vllm_left(self) -> list[int]:
        return self.operated.plan.vllm_left(self.sup.config(), self._protected())

    def log_tail(self, lines: int) -> list[str]:
        return self.operated.vllm_log.last(lines)

    def log_entries(self, lines: int, since: float | None) -> list[tuple[float, str]]:
        return self.operated.vllm_log.entries(lines, since)

    async def follow_log(self, backlog: list[str]) -> AsyncIterator[str]:
        send, receive = anyio.create_memory_object_stream[str](FOLLOW_BUFFER)

        def offer(line: str) -> None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.send_nowait(line)

        unsubscribe = self.operated.vllm_log.subscribe(offer)
        try:
            for line in backlog:
                yield line
            async for line in receive:
                yield line
        finally:
            unsubscribe()
            send.close()

    async def preflight(self, *, dry_run: bool) -> PreflightReport:
        """An operator's (or the head's) preflight: never touches the watched instance."""
        return await self.operated.preflight.operator(self.sup.config(), dry_run=dry_run, protect=self._protected())

    def last_preflight(self) -> list[dict[str, Any]]:
        return self.operated.preflight.last

    async def flight_records(self, *, since: float | None, until: float | None, local: bool) -> dict[str, Any]:
        return await flight_records(self.sup.config(), None if local else self.group, since=since, until=until)
