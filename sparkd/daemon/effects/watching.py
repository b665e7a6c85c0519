"""Watching this node's instance: its :class:`~sparkd.daemon.watch.instance.InstanceWatch` built and started when it
is launched or adopted (its record written first), closed when it is stopped; and what the watch tells heard with
the node's facts: its lines go to :class:`~sparkd.daemon.effects.output.VllmOutput`, its exits are classified with
the guard's evidence, and a wedge carries the GPUs' power and, seen while a peer's sparkd is unreachable, is the
peer's loss (:func:`sparkd.supervisor.peerloss.wedge_or_peer_lost`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from sparkd.config import Config, HealthConfig
from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import headless
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.watch.clientconns import listen_families
from sparkd.daemon.watch.gpus import GpuSampler
from sparkd.daemon.watch.instance import InstanceWatch, Probes, Watched
from sparkd.daemon.watch.steps import StepSense
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.launch.render import health_settings
from sparkd.runtime.base import Runtime
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import HealthTracker, topology_of
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.peerloss import WEDGES, wedge_or_peer_lost
from sparkd.supervisor.readings import VllmMetrics
from sparkd.supervisor.states import State
from sparkd.supervisor.stepwatch import StepWatch


class Mailbox(Protocol):
    """The loop as the parts that post to it see it: the queue in, the node's state now."""

    def post(self, obs: v.Observation) -> None: ...

    def state(self) -> State: ...

    def node(self) -> NodeState: ...


class GroupView(Protocol):
    """The group as a watch's verdict needs it (the coordinator)."""

    def unreachable(self) -> list[str]: ...

    async def head_stops_the_group(self) -> bool: ...


class NodeWatchReports:
    """What the watch tells, as the node hears it (:class:`sparkd.daemon.watch.instance.WatchReports`)."""

    def __init__(self, mailbox: Mailbox, output: VllmOutput, evidence: NodeEvidence, *, group: GroupView | None,
                 gpu: GpuSampler | None) -> None:
        self.mailbox = mailbox
        self.output = output
        self.evidence = evidence
        self.group = group
        self.gpu = gpu  # the launch's GPUs: a wedge verdict carries their power

    def state(self) -> State:
        return self.mailbox.state()

    def on_line(self, line: str, persist: bool = True) -> None:
        self.output.on_line(line, persist)

    async def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                            engine_gone: bool = False) -> Failure:
        return await self.evidence.classify_exit(exit_code, sig, hint, engine_gone, self.mailbox.node())

    async def head_stops_the_group(self) -> bool:
        return await self.group.head_stops_the_group() if self.group is not None else False

    def post(self, obs: v.Observation) -> None:
        """The watch's observations; a wedge carries the GPUs' power, and seen while a peer's sparkd is unreachable
        it is the peer's loss."""
        if isinstance(obs, v.HealthFailed) and obs.failure.cls in WEDGES:
            lost = self.group.unreachable() if self.group is not None else []
            cfg = self.mailbox.node().config
            wedged_for = obs.wedged_for_s if obs.wedged_for_s is not None else cfg.health.stall_after_s
            seen = self.gpu.annotate(obs.failure, wedged_for) if self.gpu else obs.failure
            failure = wedge_or_peer_lost(seen, lost)
            obs = replace(obs, failure=failure) if failure.cls in WEDGES else v.HealthFailed(
                failure, obs.grace_s, obs.recorded)
        self.mailbox.post(obs)


class HealthSettings:
    """``[health]`` as the watch applies it (``execute_timeout_s`` from the launch's environment when unset), from
    the config in force: derived once per config."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        self._made: tuple[weakref.ref[Config], HealthConfig] | None = None  # keeps no config alive

    def __call__(self) -> HealthConfig:
        cfg = self.config()
        if self._made is None or self._made[0]() is not cfg:
            self._made = (weakref.ref(cfg), health_settings(cfg))
        return self._made[1]


class Watching:
    """The instance's watch, from its launch or adoption to its stop. Built before the memory guard, which asks it
    whether vLLM is idle; what the watch tells goes to the reports handed with each instance (they classify with
    the guard's facts)."""

    def __init__(self, runtime: Runtime, record: InstanceRecord, probes: Callable[[Config], Probes],
                 spawn: Callable[..., None], settings: HealthSettings, clock: Clock, log: Logger,
                 steps: StepSense | None = None) -> None:
        """``probes``: vLLM's HTTP surface as the instance's launch config says (where it listens, what it
        serves); ``steps``: the step probe's sense (issue 38)."""
        self.runtime = runtime
        self.steps = steps
        self.record = record
        self.probes = probes
        self.spawn = spawn
        self.settings = settings
        self.clock = clock
        self.log = log
        self.watch: InstanceWatch | None = None  # the instance's, from its launch or adoption to its stop

    def attach(self, instance: Instance, cfg: Config, reports: NodeWatchReports, *, adopted: bool) -> None:
        """Record ``instance`` and watch it from now on, telling ``reports`` what the watch sees."""
        self.record.write(instance)
        watched = Watched(
            instance, replay=adopted,
            topology=topology_of(cfg.nnodes, cfg.launch.tensor_parallel_size, cfg.launch.pipeline_parallel_size),
            clients_port=cfg.launch.port if self.runtime.shares_host_network else None,
            clients_families=listen_families(cfg.launch.host),
            steps=self.steps if cfg.health.step_probe else None,
            step_identity=self.steps.identity(cfg) if self.steps is not None else "")
        rank_headless = headless(cfg)
        reports.output.begin(cfg, headless=rank_headless)
        self.watch = InstanceWatch(watched, self.runtime, reports, None if rank_headless else self.probes(cfg),
                                   self.settings, self.clock, self.log)
        self.spawn(self.watch.run)

    async def close(self) -> None:
        """The instance is stopped: its watch ends (its probes' connections closed)."""
        watch, self.watch = self.watch, None
        if watch is not None:
            await watch.close()

    # ---- for the views and the guard (read only)
    def health(self) -> HealthTracker | None:
        return self.watch.health if self.watch is not None else None

    def instance_probes(self) -> Probes | None:
        """vLLM's HTTP surface as the watched instance's launch says (None: none watched, or a headless rank)."""
        return self.watch.probes if self.watch is not None else None
    def step_watch(self) -> StepWatch | None:
        """What the step probe's watch last made of every rank's records, while it reads them."""
        watch = self.watch
        return watch.step_watch if watch is not None and watch.steps is not None else None

    def metrics(self) -> VllmMetrics | None:
        """vLLM's last metrics scrape, while it is watched."""
        return self.watch.vllm_metrics if self.watch is not None else None
