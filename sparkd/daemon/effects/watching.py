"""Watching this node's instance: its :class:`~sparkd.daemon.watch.instance.InstanceWatch` built and started when it is
launched or adopted (its record written first), and what the watch tells heard with the node's facts: its lines
go to :class:`~sparkd.daemon.effects.output.VllmOutput`, its exits are classified with the guard's evidence, and a wedge
carries the GPUs' power and, seen while a peer's sparkd is unreachable, is the peer's loss
(:func:`sparkd.supervisor.peerloss.wedge_or_peer_lost`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.daemon.watch.gpus import GpuSampler
from sparkd.daemon.watch.instance import InstanceWatch, Probes, Watched
from sparkd.host.clock import Clock
from sparkd.launch.render import health_settings
from sparkd.runtime.base import Instance
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import topology_of
from sparkd.supervisor.peerloss import WEDGES, wedge_or_peer_lost
from sparkd.supervisor.states import State


class Mailbox(Protocol):
    """The supervisor as the parts that post to it see it: the queue in, the state now."""

    def post(self, obs: v.Observation) -> None: ...

    def state(self) -> State: ...


class Unreachable(Protocol):
    """The group as a watch's verdict needs it (the coordinator)."""

    def unreachable(self) -> list[str]: ...


class NodeWatchReports:
    """What the watch tells, as the node hears it (:class:`sparkd.daemon.watch.instance.WatchReports`)."""

    def __init__(self, config: CurrentConfig, mailbox: Mailbox, output: VllmOutput, evidence: NodeEvidence, *,
                 group: Unreachable | None, gpu: GpuSampler | None) -> None:
        self.config = config
        self.mailbox = mailbox
        self.output = output
        self.evidence = evidence
        self.group = group
        self.gpu = gpu  # the launch's GPUs: a wedge verdict carries their power

    def state(self) -> State:
        return self.mailbox.state()

    def on_line(self, line: str, persist: bool = True) -> None:
        self.output.on_line(line, persist)

    def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                      engine_gone: bool = False) -> Failure:
        return self.evidence.classify_exit(exit_code, sig, hint, engine_gone)

    def post(self, obs: v.Observation) -> None:
        """The watch's observations; a wedge carries the GPUs' power, and seen while a peer's sparkd is unreachable
        it is the peer's loss."""
        if isinstance(obs, v.HealthFailed) and obs.failure.cls in WEDGES:
            lost = self.group.unreachable() if self.group is not None else []
            cfg = self.config()
            seen = self.gpu.annotate(obs.failure, cfg.health.stall_after_s) if self.gpu else obs.failure
            failure = wedge_or_peer_lost(seen, lost)
            obs = replace(obs, failure=failure) if failure.cls in WEDGES else v.HealthFailed(
                failure, obs.grace_s, obs.recorded)
        self.mailbox.post(obs)


class Watching:
    def __init__(self, plan: LaunchPlan, record: InstanceRecord, reports: NodeWatchReports,
                 probes: Callable[[], Probes], spawn: Callable[..., None], clock: Clock, log: Any) -> None:
        self.plan = plan
        self.record = record
        self.reports = reports
        self.probes = probes
        self.spawn = spawn
        self.clock = clock
        self.log = log

    def attach(self, instance: Instance, *, adopted: bool) -> None:
        """Record ``instance`` and watch it from now on."""
        cfg, runtime = self.plan.config(), self.plan.runtime
        self.record.write(instance)
        watched = Watched(
            instance, replay=adopted,
            topology=topology_of(cfg.nnodes, cfg.launch.tensor_parallel_size, cfg.launch.pipeline_parallel_size),
            clients_port=cfg.launch.port if runtime.shares_host_network else None)
        watch = InstanceWatch(watched, runtime, self.reports, None if self.plan.headless else self.probes(),
                              health_settings(cfg), self.clock, self.log)
        self.plan.slot.hold(instance, watch)
        self.spawn(watch.run)

    def configure(self, cfg: Any) -> None:
        """A reloaded config: the watch's health settings apply at once."""
        watch = self.plan.slot.watch
        if watch is not None:
            watch.configure(health_settings(cfg))
