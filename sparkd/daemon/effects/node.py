"""This node's vLLM: the lifecycle's effects (:class:`sparkd.daemon.loop.supervisor.Effects`), each carried out by
the part that owns it and posted back as an observation; nothing here decides about the lifecycle.

- ``launching.Launcher``: adoption at boot and the launch, then the watch (``watching.Watching``);
- ``preflighting.Preflight``: the gates and checks before a launch, a group head's workers';
- ``stopping.StopEffects``: the stop, the sweep, the GPU memory's release;
- ``nodeevidence.NodeEvidence``: a failure counted and its incident written;
- ``accepting.AcceptanceGate``: the acceptance gate, between starting and ready and while vLLM serves.

:class:`Node` composes them: on a group's head it prepares, starts and stops the workers beside its own rank; on a
worker it tells the head at once when its rank fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from sparkd.config import Role
from sparkd.daemon.effects.accepting import AcceptanceGate
from sparkd.daemon.effects.launching import Launcher
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.preflighting import Preflight
from sparkd.daemon.effects.stopping import StopEffects
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.stopreport import StopReport

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator


@dataclass(frozen=True)
class Parts:
    """The parts that carry out the lifecycle's effects, one per kind of action."""

    launcher: Launcher
    preflight: Preflight
    stops: StopEffects
    evidence: NodeEvidence
    acceptance: AcceptanceGate


class Node:
    """The lifecycle's effects (the loop's ``Effects`` port), each handed to its part with the node's state its
    action was decided in."""

    def __init__(self, parts: Parts, *, group: Coordinator | None, post: Callable[[v.Observation], None],
                 spawn: Callable[..., None], rand: Callable[[], float] = random.random) -> None:
        self.launcher = parts.launcher
        self.preflighting = parts.preflight
        self.stops = parts.stops
        self.evidence = parts.evidence
        self.acceptance = parts.acceptance
        self.group = group
        self.post = post
        self.spawn = spawn
        self.rand = rand

    @property
    def role(self) -> Role | None:
        return self.group.role if self.group is not None else None

    async def preflight(self, state: NodeState) -> None:
        """This node's checks; on a group's head also every worker's (in parallel), then the workers start."""
        failure, timing = await self.preflighting.run(state.config)
        self.post(v.PreflightDone(failure, rand=self.rand(), timing=timing))

    async def launch(self, state: NodeState) -> None:
        self.post(await self.launcher.launch(state))

    async def stop(self, stop: v.Stop, state: NodeState) -> None:
        """Stop this node's rank; on a group's head, the workers' once the head's engine has finished its requests
        or given up (a worker stopped first turns every request in flight into an NCCL error) — at once when there
        is nothing to drain — then the group's "every rank stopped, no VLLM::* left" proof as before."""
        reports: list[StopReport | None] = []
        requests_done = anyio.Event()

        async def local() -> None:
            report = await self.stops.stop(stop, state, requests_done)
            if report is not None and stop.failure is not None:  # beside the loop: the incident may still be written
                self.spawn(self.evidence.note_stop, stop.failure, report.to_json())
            reports.append(report)

        async def workers(group: Coordinator) -> None:
            await requests_done.wait()
            await group.stop_workers()

        async with anyio.create_task_group() as tg:
            if self.role is Role.head and self.group is not None:
                tg.start_soon(workers, self.group)
            tg.start_soon(local)
        self.post(v.StopDone(reports[0], rand=self.rand()))

    async def cut(self, cut: v.CutStop, state: NodeState) -> None:
        """``sparkctl stop --now`` (or ``restart --now``), or a wedge named, while this node's stop drains: end it
        now."""
        self.stops.cut(cut.why)

    async def record(self, record: v.RecordIncident, state: NodeState) -> None:
        """Count the failure and keep its evidence (the guard wrote its own already); tell the group's head."""
        if self.role is Role.worker and self.group is not None:
            self.spawn(self.group.report_failure, record.failure)
        await self.evidence.record(record.failure, record.written, state)

    async def accept(self, run: v.RunGate, state: NodeState) -> None:
        """The acceptance gate against the instance; its verdict posted (on a head it speaks for the group)."""
        await self.acceptance.run(run, state)
