"""Adoption at boot and the launch: :class:`Launcher` finds the instance this node launched before sparkd
(re)started (the record proven to be this node's launch), and launches vLLM (its timing, its marker, the refusal's
class); either way the instance is watched from then on (:class:`sparkd.daemon.effects.watching.Watching`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psutil

from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.watching import Watching
from sparkd.daemon.loop.timing import LaunchTiming
from sparkd.host.clock import Clock
from sparkd.runtime.base import Instance, LaunchError
from sparkd.runtime.proctree import MARKER_ENV, ProcessIdentity, launch_marker
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.launchfailure import host_refused, launch_refused
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.states import Machine, State


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
