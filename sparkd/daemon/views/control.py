"""The daemon's surface for the control commands (``sparkd.commands.base.Control``), over the supervisor, the
node and the view. Commands post observations and read status here; they never reach further in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.commands.port import Checks
from sparkd.commands.statusdoc import Status
from sparkd.config import Role
from sparkd.daemon.boot.reload import ReloadReport
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.node import Node
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.daemon.views.recorder import flight_records
from sparkd.daemon.views.status import StatusView
from sparkd.preflight.runner import PreflightReport
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import State, refusal

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

FOLLOW_BUFFER = 10_000  # lines a slow `sparkctl logs -f` may fall behind before it misses some


class DaemonControl:
    def __init__(self, sup: Supervisor, node: Node, view: StatusView, group: Coordinator | None, *,
                 reload: Callable[[], Awaitable[ReloadReport]], handover: Callable[[], None],
                 checks: Checks | None = None) -> None:
        self.sup = sup
        self.checks: Checks = checks or GroupChecks(node.cfg, node.runtime, None, log=node.log,
                                                    image=node.facts.identity)
        self.node = node
        self.view = view
        self.group = group
        self.worker = group is not None and group.role is Role.worker
        self.incidents_root: Path = node.cfg.paths.incidents
        self._reload = reload
        self._handover = handover
        self._changed = anyio.Event()
        sup.listen(lambda before, after, obs: self._signal())

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def stop_timeout_s(self) -> float:
        return self.node.cfg.supervisor.stop_grace_s + 30.0

    def status(self) -> Status:
        return self.view.status()

    async def reload(self) -> ReloadReport:
        return await self._reload()

    def handover(self) -> None:
        self._handover()

    async def recreate(self) -> tuple[bool, str]:
        return await self.node.facts.recreate()

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
        return self.node.instance is not None

    def stopped(self) -> bool:
        return self.node.instance is None and self.sup.machine.state in (State.stopped, State.failed)

    def vllm_left(self) -> list[int]:
        return self.node.plan.vllm_left()

    def log_tail(self, lines: int) -> list[str]:
        return self.node.vllm_log.last(lines)

    def log_entries(self, lines: int, since: float | None) -> list[tuple[float, str]]:
        return self.node.vllm_log.entries(lines, since)

    async def follow_log(self, backlog: list[str]) -> AsyncIterator[str]:
        send, receive = anyio.create_memory_object_stream[str](FOLLOW_BUFFER)

        def offer(line: str) -> None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.send_nowait(line)

        unsubscribe = self.node.vllm_log.subscribe(offer)
        try:
            for line in backlog:
                yield line
            async for line in receive:
                yield line
        finally:
            unsubscribe()
            send.close()

    async def preflight(self, *, dry_run: bool) -> PreflightReport:
        return await self.node.operator_preflight(dry_run=dry_run)

    def last_preflight(self) -> list[dict[str, Any]]:
        return self.node.last_preflight

    async def flight_records(self, *, since: float | None, until: float | None, local: bool) -> dict[str, Any]:
        return await flight_records(self.node.cfg, None if local else self.group, since=since, until=until)
