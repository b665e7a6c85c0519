"""Adoption at boot and the launch: :class:`Launcher` finds the instance this node launched before sparkd
(re)started (the record proven to be this node's launch), and launches vLLM under the config its action was
decided with (its timing, its marker, the refusal's class); either way the instance is watched from then on
(:class:`sparkd.daemon.effects.watching.Watching`) and rides to the loop on the observation (``Adopted``,
``Launched``)."""

from __future__ import annotations

from dataclasses import replace

import psutil

from sparkd.config import Config
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.watching import NodeWatchReports, Watching
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.runtime.base import Instance, LaunchError
from sparkd.runtime.proctree import MARKER_ENV, ProcessIdentity, launch_marker
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.graces import launched_drain_s
from sparkd.supervisor.launchfailure import host_refused, launch_refused
from sparkd.supervisor.timing import LaunchTiming


class Launcher:
    def __init__(self, plan: LaunchPlan, record: InstanceRecord, facts: ContainerFacts, evidence: NodeEvidence,
                 watching: Watching, reports: NodeWatchReports, clock: Clock, log: Logger) -> None:
        self.plan = plan
        self.runtime = plan.runtime
        self.record = record
        self.facts = facts  # the image and the container's drift
        self.output = reports.output
        self.evidence = evidence
        self.watching = watching
        self.reports = reports  # what the instance's watch tells, heard with the node's facts
        self.clock = clock
        self.log = log

    async def adopt(self, cfg: Config) -> Instance | None:
        """Find the instance this node launched before sparkd (re)started and watch it again."""
        await self.facts.read_image()
        record = self.record.read()  # a bad record is set aside, logged, and treated as absent
        try:
            instance = await self.runtime.find(record)
        except Exception as exc:  # the engine is down at boot: nothing to adopt now; the record stays
            self.log.warning("adoption_impossible", error=str(exc), record=str(self.record.path))
            return None
        if instance is not None and record is not None and not self.plan.proven(record, cfg):
            self.log.warning("record_not_proven", pid=instance.pid, record=str(self.record.path),
                             why="the process the record names does not carry this node's launch marker and does "
                                 "not run what the config launches; not adopted, not touched")
            instance = None
        if instance is None:
            if record is not None:
                self.record.remove()
            return None
        if instance.drain_s is None:  # a record written before sparkd kept the drain: vLLM's argv says it
            instance = instance.with_drain(launched_drain_s(_cmdline(instance.pid)))
        self.log.info("adopted", pid=instance.pid, container=instance.container_id, drain_s=instance.drain_s)
        self.watching.attach(instance, cfg, self.reports, adopted=True)
        return instance

    async def launch(self, state: NodeState) -> v.Observation:
        """Launch vLLM as ``state.config`` says: ``Launched``, or ``LaunchFailed`` with the refusal's class."""
        cfg = state.config
        spec = self.plan.spec(cfg)
        timing = state.timing or LaunchTiming(requested_at=self.clock.now())
        called = self.clock.now()
        timing = timing.step("queue", called - timing.requested_at - timing.steps.get("preflight", 0.0))
        argv = self.output.launching(spec.argv, cfg)
        marker = launch_marker()  # every process of the launch inherits it: the proof it is ours
        try:
            instance = await self.runtime.launch(replace(spec, env={**spec.env, MARKER_ENV: marker}))
        except LaunchError as exc:
            return v.LaunchFailed(launch_refused(str(exc), unavailable=exc.unavailable, exit_code=exc.exit_code))
        except OSError as exc:  # the host refuses what the launch writes: wait for it, spend no budget
            return v.LaunchFailed(host_refused(str(exc.strerror or exc), exc.filename, repr(exc)))
        instance = _with_identity(instance, marker).with_drain(spec.drain_s)
        self.evidence.mark_launch()
        exec_at = self.clock.now()
        timing = timing.executed(exec_at).step("runtime.launch", exec_at - called)
        self.log.info("launched", pid=instance.pid, container=instance.container_id, argv=argv,
                      sparkd_s=round(exec_at - timing.requested_at, 4))
        self.watching.attach(instance, cfg, self.reports, adopted=False)
        return v.Launched(instance, timing)


def _with_identity(instance: Instance, marker: str) -> Instance:
    try:
        identity = ProcessIdentity.of(instance.pid, marker)
    except (psutil.Error, ValueError):  # it ended already: wait() reports how
        return instance
    return replace(instance, identity=identity.to_record())


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.Error, ValueError):
        return []
