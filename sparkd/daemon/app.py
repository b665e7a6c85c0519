"""``sparkd run``: build the daemon for this node from its config, and run it until it is told to stop.

The composition root: it builds every part in one pass — the loop first (:class:`Supervisor`, the one owner of the
node's state), then the senses, the effects and the views over it — and names, once, what follows a change of the
node's state (:func:`sparkd.daemon.loop.supervisor.in_order`). Startup problems are sentences and exit statuses
(``sparkd.host.exits``), never tracebacks: another sparkd holding the node's lock, a control port taken, a
directory that cannot be written. Signals: :mod:`sparkd.daemon.boot.sighandler`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from sparkd.api.bounded import harden_process
from sparkd.cluster.addresses import PeerAddresses
from sparkd.cluster.ranks import group_role
from sparkd.config import Config, GuardConfig, Role
from sparkd.daemon.adapters import Adapters
from sparkd.daemon.boot.breaker import ConfigBreaker
from sparkd.daemon.boot.reload import Reloader
from sparkd.daemon.boot.serving import start_servers
from sparkd.daemon.boot.sighandler import SignalHandler
from sparkd.daemon.boot.sockets import Sockets, StartupError, open_sockets
from sparkd.daemon.boot.startup import Trusted, bound_malloc_arenas, prepare_or_status
from sparkd.daemon.effects.accepting import AcceptanceGate, http_answers
from sparkd.daemon.effects.compilememory import CompileMemory
from sparkd.daemon.effects.draining import DrainWatch
from sparkd.daemon.effects.evidence import FailureEvidence
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.guarding import NodeGuardHooks
from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.launching import Launcher
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.node import Node, Parts
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.preflighting import GroupStart, LocalPreflight, Preflight
from sparkd.daemon.effects.redaction import Redaction
from sparkd.daemon.effects.registry import InstanceRegistry
from sparkd.daemon.effects.restartgate import StartGuard
from sparkd.daemon.effects.stopping import StopEffects
from sparkd.daemon.effects.upkeep import Upkeep
from sparkd.daemon.effects.watching import HealthSettings, NodeWatchReports, Watching
from sparkd.daemon.loop import remembered
from sparkd.daemon.loop.nodestate import NodeState, limits_from
from sparkd.daemon.loop.supervisor import Supervisor, in_order
from sparkd.daemon.loop.tasks import Tasks
from sparkd.daemon.views.control import DaemonControl, Operated
from sparkd.daemon.views.facts import DaemonFacts
from sparkd.daemon.views.flightrecords import FlightRecorder, RecorderOff
from sparkd.daemon.views.metrics import Metrics, RecorderCollector
from sparkd.daemon.views.ownlog import OwnLog
from sparkd.daemon.views.publish import Publisher
from sparkd.daemon.views.starttimes import StartTimes
from sparkd.daemon.views.status import History, Seen, StatusView
from sparkd.daemon.views.webhooks import Webhooks, served_base
from sparkd.daemon.watch.gpus import GpuSampler, LaunchDevices
from sparkd.daemon.watch.memory import MemorySampler
from sparkd.daemon.watch.probes import HttpProbes
from sparkd.daemon.watch.replays import ReplayTimer
from sparkd.daemon.watch.steps import StepSense
from sparkd.guard.guard import Guard
from sparkd.host import exits
from sparkd.host.logs import VllmLog, configure_logging, get_logger
from sparkd.launch.redact import use_for_logs
from sparkd.launch.render import api_key
from sparkd.runtime import make_runtime
from sparkd.runtime.base import Runtime
from sparkd.state.lock import AlreadyRunning, NodeLock
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.states import restore

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator


def guard_section(config: Callable[[], Config]) -> Callable[[], GuardConfig]:
    return lambda: config().guard


class Daemon:
    """Everything one node's sparkd runs, built from the config and wired through narrow ports: the loop first,
    then every part that posts to it or reads its state, each complete when its constructor returns."""

    def __init__(self, cfg: Config, runtime: Runtime, *, rehearse: bool = False, config_path: Path | None = None,
                 trusted: Trusted | None = None, adapters: Adapters | None = None) -> None:
        """``adapters``: the host as the daemon reaches it (a test's stand-ins: the clock, the probes, the guard)."""
        self.runtime = runtime
        self.adapters = host = adapters or Adapters()
        self.clock, self.notifier = host.clock, host.notifier
        self.log = get_logger(node=cfg.node.name, role=cfg.node.role.value)
        self.trusted = trusted or Trusted.unchecked(cfg)  # `sparkd run` checked the token file (owner, mode, length)
        self.files, self.tasks = StateWriter(self.log), Tasks()
        self.state_dir = cfg.paths.state_dir  # where it keeps state: fixed until sparkd restarts
        machine = restore(remembered.load(self.state_dir / "lifecycle.json", self.clock, self.log), self.clock.now())
        self.sup = sup = Supervisor(state=NodeState.boot(machine, cfg), clock=self.clock, log=self.log,
                                    remember=self._remember)
        runtime.follow(sup.config)
        self.redaction = Redaction(sup.config, self.trusted.token)
        use_for_logs(self.redaction.of(cfg))  # secrets never reach a log
        self.vllm_log = VllmLog.following(sup.config)
        self.peer_addresses = PeerAddresses(cfg.cluster.peers) if cfg.cluster.peers else None
        self.facts = ContainerFacts(runtime, self.state_dir)
        self.group = self._group()
        self.checks = GroupChecks(sup.config, runtime, self.group.client if self.group is not None else None,
                                  log=self.log, image=self.facts.identity, spawn=self.tasks.spawn)
        self.gpu = GpuSampler(host.gpus, self.clock, self.log, LaunchDevices(sup.config, runtime.name,
                                                                              rehearse=rehearse))
        self.steps = self._steps()
        self.evidence = FailureEvidence(runtime, self.redaction, cfg.paths.incidents, vllm_log=self.vllm_log,
                                        clock=self.clock, log=self.log, gpu=self.gpu.incident_evidence,
                                        steps=self.steps.evidence)
        self.registry = InstanceRegistry(sup.config, config_path, self.log)
        record = InstanceRecord(self.state_dir / "instance.json", self.files, self.registry, self.clock, self.log)
        probes = self._probes if host.probes is None else _probes_of(host.probes)
        self.watching = Watching(runtime, record, probes, self.tasks.spawn, HealthSettings(sup.config), self.clock,
                                 self.log, steps=self.steps)
        # the webhooks ([notify], issue 40): the notifier only where targets exist; the guard's decisions told too
        self.webhooks = Webhooks(sup.config, self.clock, self.log, base=served_base(cfg), transport=host.webhooks)
        self.guard_hooks = NodeGuardHooks(sup.node, runtime, self.watching.metrics, self.evidence.write_guard_evidence,
                                          sup.post, self.log, tell=self.webhooks.guard)
        self.own_guard = host.guard is None and cfg.guard.enabled  # a stand-in's is not run
        self.guard = Guard(guard_section(sup.config), self.guard_hooks) if self.own_guard else host.guard
        self.node = self._effects(record, LaunchPlan(runtime, rehearse=rehearse))
        self._views(config_path)

    def _effects(self, record: InstanceRecord, plan: LaunchPlan) -> Node:
        """The lifecycle's effects, each part over the ones built before it; the flight recorder, which the memory
        settle notes into, with them."""
        host, sup, clock, log = self.adapters, self.sup, self.clock, self.log
        self.local = LocalPreflight(plan, host.checks, self.facts, self.evidence, log)
        self.seen = Seen(self.guard, self.gpu, self.watching, self.group, self.evidence.counters, self.facts,
                         self.local)
        self.memory = MemorySampler(sup.config(), clock)
        self.recorder = self._recorder()
        self.start_guard = StartGuard(self.state_dir, self.memory, self.recorder.note, sup.post, self.files, clock, log)
        self.compiled = CompileMemory(self.state_dir, self.files, self.facts.image_id, log)
        output = VllmOutput(self.redaction, self.vllm_log, sup.post, DrainWatch(sup.post, clock, log), self.compiled,
                            clock, log)
        self.leftovers = Leftovers(plan, self.state_dir, sweep=host.sweep, gpus=host.gpus, clock=clock, log=log)
        evidence = NodeEvidence(self.evidence, self.guard, self.local)
        reports = NodeWatchReports(sup, output, evidence, group=self.group, gpu=self.gpu)
        self.launcher = Launcher(plan, record, self.facts, evidence, self.watching, reports, clock, log)
        preflight = Preflight(self.local, GroupStart(self.group, self.checks), self.leftovers,
                              before_start=self.start_guard.before_start, guard=self.guard, clock=clock)
        self.stops = StopEffects(self.runtime, record, output, self.leftovers, self.watching, clock, log)
        self.upkeep = Upkeep(sup.node, self.leftovers, self.registry)
        self.acceptance = AcceptanceGate(plan, self.facts, sup.post, host.answers or http_answers, self.state_dir,
                                         clock, log)
        self.replays = ReplayTimer(sup.node, self.watching.metrics, self.watching.health, sup.post, clock)
        self.operated = Operated(self.vllm_log, self.local, self.facts, plan, self.checks, self.acceptance,
                                 steps=self.steps)
        parts = Parts(self.launcher, preflight, self.stops, evidence, self.acceptance)
        return Node(parts, group=self.group, post=sup.post, spawn=self.tasks.spawn, rand=host.rand)

    def _recorder(self) -> FlightRecorder:
        cfg = self.sup.config()
        if not cfg.recorder.enabled:
            return RecorderOff(cfg)
        from sparkd.daemon.views.recorder import DaemonRecorder  # the ring's modules: a recorder's only

        return DaemonRecorder(self.sup.node, self.seen, self.memory, self.clock, self.log,
                              alive_at=self._alive_at)

    def _views(self, config_path: Path | None) -> None:
        """The views and the operator's surface, over the parts built above; what follows a change of the node's
        state, in order (a new view that reacts to changes goes in this one list)."""
        sup = self.sup
        self.reloader = Reloader(config_path, sup.config, sup.submit, self.log)
        self.breaker = ConfigBreaker(self.state_dir / "breaker-config.json", sup.config, sup.post, self.files,
                                     self.log)
        self.history = History(self.clock)
        facts = DaemonFacts(sup.node, self.files, self.vllm_log, self.recorder, self.start_guard, self.reloader,
                            self.breaker, self.checks)
        self.view = StatusView(sup.node, self.seen, facts, self.history, self.clock, token=self.trusted.token,
                               webhooks=self.webhooks)
        self.metrics = Metrics(self.view)
        self.metrics.registry.register(RecorderCollector(self.metrics.families, self.recorder, self.start_guard))
        self.control = DaemonControl(sup, self.view, self.operated, self.group, reload=self.reloader.reload,
                                     handover=self.handover)
        self.publisher = Publisher(self.files, self.state_dir / "status.json", self.view, self.notifier, sup.booted)
        self.webhooks.tell_changes(self.publisher.publish)  # a target failing or delivering shows in status.json
        self.signals = SignalHandler(sup, self.reloader, self.stops.hurry, self.notifier, self.log)
        self.on_state = in_order(self.recorder.on_state, self.start_guard.on_state, self.history.on_state,
                                 self.metrics.on_state, self.control.on_state, self.breaker.on_state,
                                 OwnLog(self.redaction, self.log).on_state, self.upkeep.on_state,
                                 StartTimes(self.files, self.state_dir, self.clock).on_state,
                                 self.webhooks.on_state, self.publisher.on_state, self.compiled.on_state,
                                 self.acceptance.on_state, self.replays.on_state)
        self._scope: anyio.CancelScope | None = None

    @property
    def cfg(self) -> Config:
        return self.sup.config()

    def _group(self) -> Coordinator | None:
        cfg = self.sup.config()
        if group_role(cfg) is None:
            return None
        from sparkd.cluster.coordinator import Coordinator  # a group's only: a single node never loads it
        from sparkd.cluster.peers import PeerClient

        return Coordinator(self.sup.config, PeerClient(self.sup.config, self.trusted.token), post=self.sup.post,
                           state=self.sup.state, image=self.facts.image_json, clock=self.clock, log=self.log,
                           addresses=self.peer_addresses)

    def _steps(self) -> StepSense:
        """The step probe's sense (issue 38): this node's files; a head asks its workers for theirs."""
        group = self.group
        workers = group.worker_steps if group is not None and group.role is Role.head else None
        return StepSense(self.sup.config, self.files.put, self.clock, self.log, image=self._image_id,
                         workers=workers)

    def _image_id(self) -> str | None:
        image = self.facts.identity()
        return image.id if image is not None else None

    def _probes(self, cfg: Config) -> HttpProbes:
        """vLLM's HTTP surface as the instance's launch says; the timeouts ``[health]``'s in force."""
        return HttpProbes(host=cfg.launch.host, port=cfg.launch.port, model=cfg.served_name, api_key=api_key(cfg),
                          settings=self.watching.settings)

    def _alive_at(self) -> float:
        return self.sup.alive_at

    def _remember(self, kept: Any) -> None:
        self.files.put(self.state_dir / "lifecycle.json", remembered.to_json(kept, self.clock))

    def handover(self) -> None:
        """Exit now and leave vLLM running, for the next sparkd to adopt (a package upgrade)."""
        instance = self.sup.instance()
        self.log.info("handover", pid=instance.pid if instance else None)
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, sockets: Sockets | None = None) -> int:
        """Run until a shutdown finds nothing running (``sockets`` None: no control API, for in-process tests)."""
        cfg = self.cfg
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                await tg.start(self.tasks.run)
                tg.start_soon(self.files.run)
                if sockets is not None:
                    self._serve(tg, sockets)
                if self.own_guard and self.guard is not None:
                    await tg.start(self.guard.run)
                if self.group is not None:
                    tg.start_soon(self.group.watch)
                tg.start_soon(self.recorder.run)
                tg.start_soon(self.signals.run, tg.cancel_scope)
                tg.start_soon(self._watchdog)
                tg.start_soon(self.gpu.run)
                tg.start_soon(self.upkeep.run)
                tg.start_soon(self.replays.run)
                tg.start_soon(self.webhooks.run)
                tg.start_soon(self.vllm_log.feed_journal)
                self.registry.write()
                self.publisher.publish()
                await self.sup.run(self.node, boot=self._boot, on_state=self.on_state)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                self.files.put(self.state_dir / "status.json", self.view.status())
                await self.files.flush()
                await self.recorder.close()
                await self.vllm_log.close_journal()
            if sockets is not None:
                cfg.paths.socket.unlink(missing_ok=True)
            self.registry.remove()
            self.vllm_log.close()
        self.log.info("daemon_exit", state=self.sup.machine.state.value)
        return exits.OK

    def _serve(self, tg: TaskGroup, sockets: Sockets) -> None:
        start_servers(tg, sockets.unix, sockets.tcp, self.control, self.metrics.render, cfg=self.cfg,
                      token=self.trusted.token, peers=self.peer_addresses, tls=self.trusted.tls, log=self.log)

    async def _boot(self) -> Instance | None:
        found = await self.launcher.adopt(self.sup.config())
        self.notifier.ready(self.view.line())
        return found

    async def _watchdog(self) -> None:
        """systemd's watchdog, petted only while the loop makes progress: each period the loop is handed a
        heartbeat (a Tick) and the next pet checks it was taken — the loop at rest does nothing else on time."""
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.notifier.pet(self.sup.alive_at, self.clock.now())
            await self.clock.sleep(interval / 2)
            self.sup.post(v.Tick())
            await self.clock.sleep(interval / 2)


def _probes_of(make: Callable[[], Any]) -> Callable[[Config], Any]:
    """A test's probes, whatever the launch."""
    return lambda cfg: make()


def run_daemon(cfg: Config, *, config_path: Path, rehearse: bool = False) -> int:
    bound_malloc_arenas()
    configure_logging(cfg.log)
    log = get_logger(node=cfg.node.name, role=cfg.node.role.value)
    harden_process()
    trusted = prepare_or_status(cfg, log)
    if isinstance(trusted, int):
        return trusted
    lock = NodeLock(cfg.paths.state_dir / "sparkd.lock")
    try:
        for folder in (cfg.paths.state_dir, cfg.paths.run_dir, cfg.paths.logs):
            folder.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except AlreadyRunning as exc:
        log.error("already_running", detail=str(exc))
        return exits.ALREADY_RUNNING
    except OSError as exc:
        log.error("startup_failed", detail=f"cannot use {exc.filename or cfg.paths.state_dir}: {exc.strerror}")
        return exits.HOST_PROBLEM
    try:
        sockets = open_sockets(cfg)
    except StartupError as exc:
        log.error("startup_failed", detail=str(exc))
        lock.release()
        return exc.status
    log.info("starting", config=str(config_path), runtime=cfg.runtime.value, rehearse=rehearse,
             launch_hash=cfg.launch_hash(), pid=os.getpid())
    try:
        daemon = Daemon(cfg, make_runtime(cfg, rehearse=rehearse), rehearse=rehearse, config_path=config_path,
                        trusted=trusted)
        # What the imports and the config made lives as long as the daemon: out of the collector's way, so a full
        # collection (~10 ms over 55k objects) walks only what the daemon allocates from now on.
        gc.freeze()
        return anyio.run(daemon.run, sockets)
    finally:
        lock.release()


__all__ = ["Daemon", "Sockets", "StartupError", "limits_from", "open_sockets", "run_daemon"]
