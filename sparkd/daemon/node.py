"""This node's vLLM: the lifecycle's effects (:class:`sparkd.daemon.supervisor.Effects`), each carried out by the
part that owns it and posted back as an observation; nothing here decides about the lifecycle.

- :class:`Launcher`: adoption at boot (the record proven to be this node's launch) and the launch (its timing, its
  marker, the refusal's class), then the watch (:class:`sparkd.daemon.watching.Watching`);
- :class:`sparkd.daemon.preflighting.Preflight`: the gates and checks before a launch, a group head's workers';
- :class:`sparkd.daemon.stopping.StopEffects`: the stop, the sweep, the GPU memory's release;
- :class:`sparkd.daemon.nodeevidence.NodeEvidence`: a failure counted and its incident written.

:class:`Node` composes them: on a group's head it prepares, starts and stops the workers beside its own rank; on a
worker it tells the head at once when its rank fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import psutil

from sparkd.config import Config, Role
from sparkd.daemon.facts import ContainerFacts
from sparkd.daemon.nodeevidence import NodeEvidence
from sparkd.daemon.output import VllmOutput
from sparkd.daemon.plan import LaunchPlan
from sparkd.daemon.preflighting import Preflight
from sparkd.daemon.record import InstanceRecord
from sparkd.daemon.stopping import StopEffects
from sparkd.daemon.stopreport import StopReport
from sparkd.daemon.timing import LaunchTiming
from sparkd.daemon.watch import InstanceWatch
from sparkd.daemon.watching import Watching
from sparkd.host.clock import Clock
from sparkd.host.logs import VllmLog
from sparkd.preflight.runner import PreflightReport
from sparkd.runtime.base import Instance, LaunchError, Runtime
from sparkd.runtime.proctree import MARKER_ENV, ProcessIdentity, launch_marker
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure
from sparkd.supervisor.launchfailure import host_refused, launch_refused
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.states import Machine, State

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator


class Launcher:
    def __init__(self, plan: LaunchPlan, record: InstanceRecord, facts: ContainerFacts, output: VllmOutput,
                 evidence: NodeEvidence, watching: Watching, clock: Clock, log: Any) -> None:
        self.plan = plan
        self.slot = plan.slot
        self.runtime = plan.runtime
        self.record = record
        self.facts = facts  # the image and the container's drift
        self.output = output
        self.evidence = evidence
        self.watching = watching
        self.clock = clock
        self.log = log

    async def adopt(self) -> bool:
        """Find the instance this node launched before sparkd (re)started and watch it again."""
        await self.facts.read_image()
        record = self.record.read()  # a bad record is set aside, logged, and treated as absent
        try:
            instance = await self.runtime.find(record)
        except Exception as exc:  # the engine is down at boot: nothing to adopt now; the record stays
            self.log.warning("adoption_impossible", error=str(exc), record=str(self.record.path))
            return False
        if instance is not None and record is not None and not self.plan.proven(record):
            self.log.warning("record_not_proven", pid=instance.pid, record=str(self.record.path),
                             why="the process the record names does not carry this node's launch marker and does "
                                 "not run what the config launches; not adopted, not touched")
            instance = None
        if instance is None:
            if record is not None:
                self.record.remove()
            return False
        self.log.info("adopted", pid=instance.pid, container=instance.container_id)
        self.slot.timing = LaunchTiming(requested_at=self.clock.now(), adopted=True)
        self.watching.attach(instance, adopted=True)
        return True

    async def launch(self) -> v.Observation:
        """Launch vLLM: ``Launched``, or ``LaunchFailed`` with the refusal's class."""
        async with self.slot.busy:
            spec = self.plan.spec()
            self.slot.progressed(Startup())
            timing = self.slot.timing or LaunchTiming(requested_at=self.clock.now())
            called = self.clock.now()
            timing.step("queue", called - timing.requested_at - timing.steps.get("preflight", 0.0))
            argv = self.output.launching(spec.argv)
            marker = launch_marker()  # every process of the launch inherits it: the proof it is ours
            try:
                instance = await self.runtime.launch(replace(spec, env={**spec.env, MARKER_ENV: marker}))
            except LaunchError as exc:
                return v.LaunchFailed(launch_refused(str(exc), unavailable=exc.unavailable, exit_code=exc.exit_code))
            except OSError as exc:  # the host refuses what the launch writes: wait for it, spend no budget
                return v.LaunchFailed(host_refused(str(exc.strerror or exc), exc.filename, repr(exc)))
            instance = _with_identity(instance, marker)
            self.evidence.mark_launch()
            timing.executed(exec_at := self.clock.now())
            timing.step("runtime.launch", exec_at - called)
            self.slot.timing = timing
            self.log.info("launched", pid=instance.pid, container=instance.container_id, argv=argv,
                          sparkd_s=round(exec_at - timing.requested_at, 4))
            self.watching.attach(instance, adopted=False)
            return v.Launched()

    def on_transition(self, before: Machine, after: Machine, obs: v.Observation) -> None:
        """Ready: the launch's timing is complete, logged once (``start_timing``)."""
        if after.state is State.ready and before.state is State.starting:
            timing = self.slot.timing
            if timing is not None and timing.ready_at is None:
                timing.ready_at = after.since
                self.log.info("start_timing", **timing.to_json())


def _with_identity(instance: Instance, marker: str) -> Instance:
    try:
        identity = ProcessIdentity.of(instance.pid, marker)
    except (psutil.Error, ValueError):  # it ended already: wait() reports how
        return instance
    return replace(instance, identity=identity.to_record())


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
