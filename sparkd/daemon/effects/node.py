"""This node's vLLM: the lifecycle's effects (:class:`sparkd.daemon.loop.supervisor.Effects`), each carried out by
the part that owns it and posted back as an observation; nothing here decides about the lifecycle.

- ``launching.Launcher``: adoption at boot and the launch, then the watch (``watching.Watching``);
- ``preflighting.Preflight``: the gates and checks before a launch, a group head's workers';
- ``stopping.StopEffects``: the stop, the sweep, the GPU memory's release;
- ``nodeevidence.NodeEvidence``: a failure counted and its incident written.

:class:`Node` composes them: on a group's head it prepares, starts and stops the workers beside its own rank; on a
worker it tells the head at once when its rank fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.config import Config, Role
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.launching import Launcher
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.preflighting import Preflight
from sparkd.daemon.effects.stopping import StopEffects
from sparkd.daemon.effects.stopreport import StopReport
from sparkd.daemon.loop.timing import LaunchTiming
from sparkd.daemon.watch.instance import InstanceWatch
from sparkd.host.logs import VllmLog
from sparkd.preflight.runner import PreflightReport
from sparkd.runtime.base import Instance, Runtime
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure
from sparkd.supervisor.progress import Startup

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator


class Node:
    """The lifecycle's effects, each handed to its part; read by the status, the metrics and the operator's
    commands through the properties below (they write nothing here)."""

    def __init__(self, launcher: Launcher, preflight: Preflight, stops: StopEffects, evidence: NodeEvidence, *,
                 group: Coordinator | None, post: Callable[[v.Observation], None], spawn: Callable[..., None],
                 rand: Callable[[], float] = random.random) -> None:
        self.launcher = launcher
        self.preflighting = preflight
        self.stops = stops
        self.evidence = evidence
        self.group = group
        self.post = post
        self.spawn = spawn
        self.rand = rand

    # ---- the lifecycle's effects
    async def adopt(self) -> bool:
        return await self.launcher.adopt()

    async def preflight(self) -> None:
        """This node's checks; on a group's head also every worker's (in parallel), then the workers start."""
        failure = await self.preflighting.run()
        self.post(v.PreflightDone(failure, rand=self.rand()))

    async def launch(self) -> None:
        self.post(await self.launcher.launch())

    async def stop(self, reason: str, grace_s: float | None, failure: Failure | None = None,
                   hung: bool = False) -> None:
        async def local() -> None:
            report = await self.stops.stop(reason, grace_s, failure, hung)
            if report is not None and failure is not None:  # beside the loop: the incident may still be written
                self.spawn(self.evidence.note_stop, failure, report.to_json())

        async with anyio.create_task_group() as tg:
            if self.role is Role.head and self.group is not None:
                tg.start_soon(self.group.stop_workers)
            tg.start_soon(local)
        self.post(v.StopDone(rand=self.rand()))

    async def record(self, failure: Failure, written: bool) -> None:
        """Count the failure and keep its evidence (the guard wrote its own already); tell the group's head."""
        if self.role is Role.worker and self.group is not None:
            self.spawn(self.group.report_failure, failure)
        await self.evidence.record(failure, written)

    # ---- for the operator, the status and the metrics (read-only)
    async def operator_preflight(self, *, dry_run: bool) -> PreflightReport:
        """An operator's (or the head's) preflight: never touches the watched instance."""
        return await self.preflighting.local.operator(dry_run=dry_run)

    @property
    def role(self) -> Role | None:
        return self.group.role if self.group is not None else None

    @property
    def plan(self) -> LaunchPlan:
        return self.launcher.plan

    @property
    def cfg(self) -> Config:
        return self.plan.config()

    @property
    def runtime(self) -> Runtime:
        return self.plan.runtime

    @property
    def log(self) -> Any:
        return self.launcher.log

    @property
    def facts(self) -> ContainerFacts:
        return self.launcher.facts

    @property
    def output(self) -> VllmOutput:
        """vLLM's output: its phase listeners, its host copy."""
        return self.launcher.output

    @property
    def vllm_log(self) -> VllmLog:
        return self.launcher.output.vllm_log

    @property
    def instance(self) -> Instance | None:
        return self.plan.slot.instance

    @property
    def watch(self) -> InstanceWatch | None:
        return self.plan.slot.watch

    @property
    def startup(self) -> Startup:
        return self.plan.slot.startup

    @property
    def timing(self) -> LaunchTiming | None:
        return self.plan.slot.timing

    @property
    def last_stop(self) -> StopReport | None:
        return self.stops.last

    @property
    def last_preflight(self) -> list[dict[str, object]]:
        return self.preflighting.local.last
