"""``sparkd run``: build the daemon for this node from its config, and run it until it is told to stop.

Startup problems are sentences and exit statuses (``sparkd.host.exits``), never tracebacks: another sparkd holding
the node's lock, a control port taken, a directory that cannot be written. Signals: SIGTERM/SIGINT stop vLLM
and exit (a second one ends vLLM at once instead of waiting out the grace; with ``leave_running`` sparkd exits
and leaves vLLM to the next daemon); SIGHUP reloads the config.
"""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from sparkd.api.bounded import harden_process
from sparkd.cluster.addresses import PeerAddresses
from sparkd.cluster.ranks import group_role
from sparkd.commands.statusdoc import Checks, Extras
from sparkd.config import Config, Role
from sparkd.daemon.adapters import Adapters
from sparkd.daemon.boot.breaker import ConfigBreaker
from sparkd.daemon.boot.reload import Reloader, keep_fixed
from sparkd.daemon.boot.serving import start_servers
from sparkd.daemon.boot.sockets import Sockets, StartupError, open_sockets
from sparkd.daemon.boot.startup import Trusted, prepare_or_status
from sparkd.daemon.effects.evidence import FailureEvidence
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.guarding import NodeGuardHooks
from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.launching import Launcher
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.node import Node
from sparkd.daemon.effects.nodeevidence import NodeEvidence
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.preflighting import GroupStart, LocalPreflight, Preflight
from sparkd.daemon.effects.registry import InstanceRegistry
from sparkd.daemon.effects.restartgate import StartGuard
from sparkd.daemon.effects.slot import InstanceSlot
from sparkd.daemon.effects.stopping import StopEffects
from sparkd.daemon.effects.watching import NodeWatchReports, Watching
from sparkd.daemon.loop import remembered
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.daemon.loop.tasks import Tasks
from sparkd.daemon.views.control import DaemonControl
from sparkd.daemon.views.metrics import Metrics, RecorderCollector
from sparkd.daemon.views.recorder import DaemonRecorder
from sparkd.daemon.views.status import StatusView
from sparkd.daemon.watch.gpus import GpuSampler, LaunchDevices
from sparkd.daemon.watch.memory import MemorySampler
from sparkd.daemon.watch.probes import HttpProbes
from sparkd.guard.guard import Guard
from sparkd.host import exits
from sparkd.host.logs import VllmLog, configure_logging, get_logger
from sparkd.launch.render import api_key
from sparkd.runtime import make_runtime
from sparkd.runtime.base import Runtime
from sparkd.state.lock import AlreadyRunning, NodeLock
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.policy import RestartPolicy
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.states import Limits, Machine, State, restore

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

SHM_NOTE_S = 60.0


def limits_from(cfg: Config) -> Limits:
    r = cfg.restart
    return Limits(
        startup_timeout_s=cfg.supervisor.startup_timeout_s,
        startup_silence_s=cfg.supervisor.startup_silence_s,
        startup_extension_s=cfg.supervisor.startup_extension_s,
        restart=RestartPolicy(
            backoff_initial_s=r.backoff_initial_s, backoff_factor=r.backoff_factor,
            backoff_max_s=max(r.backoff_max_s, r.backoff_initial_s), jitter=min(r.jitter, 0.99),
            stable_after_s=r.stable_after_s, budget_failures=r.budget_failures,
            budget_window_s=r.budget_window_s, guard_kill_weight=r.guard_kill_weight,
            consecutive_limit=r.consecutive_limit or None,
        ),
        led=group_role(cfg) is Role.worker,
    )


class Daemon:
    """Everything one node's sparkd runs, built from the config and wired through narrow ports: the mailbox first
    (the supervisor), then every part that posts to it, each complete when its constructor returns."""

    def __init__(self, cfg: Config, runtime: Runtime, *, rehearse: bool = False, config_path: Path | None = None,
                 trusted: Trusted | None = None, adapters: Adapters | None = None) -> None:
        """``adapters``: the host as the daemon reaches it (a test's stand-ins: the clock, the probes, the guard)."""
        self.runtime = runtime
        self.adapters = host = adapters or Adapters()
        self.clock, self.notifier = host.clock, host.notifier
        self.log = get_logger(node=cfg.node.name, role=cfg.node.role.value)
        self.trusted = trusted or Trusted.unchecked(cfg)  # `sparkd run` checked the token file (owner, mode, length)
        self.token = self.trusted.token
        self.config = CurrentConfig(cfg, token=self.token)
        self.files = StateWriter(self.log)
        self.vllm_log = VllmLog.from_config(cfg)
        self.tasks = Tasks()
        self.peer_addresses = PeerAddresses(cfg.cluster.peers) if cfg.cluster.peers else None
        machine = restore(remembered.load(self.lifecycle_path, self.clock, self.log), self.clock.now())
        self.sup = Supervisor(machine=machine, limits=limits_from(cfg), clock=self.clock, log=self.log,
                              remember=self._remember)
        self.slot, self.facts = InstanceSlot(runtime), ContainerFacts(runtime)
        self.plan = LaunchPlan(self.config, runtime, self.slot, rehearse=rehearse)  # what it launches, read afresh
        self.group = self._group()
        self.checks = GroupChecks(cfg, runtime, self.group.client if self.group is not None else None, log=self.log,
                                  image=self.facts.identity, spawn=self.tasks.spawn)
        self.gpu = GpuSampler(host.gpus, self.clock, self.log,
                              LaunchDevices(self.config, runtime.name, rehearse=rehearse))
        self.evidence = FailureEvidence(self.config, runtime, vllm_log=self.vllm_log, clock=self.clock, log=self.log,
                                        state=self.sup.state, instance=self.slot.current,
                                        gpu=self.gpu.incident_evidence)
        self.guard_hooks = NodeGuardHooks(self.slot, self.evidence.write_guard_evidence, self.sup.post,
                                          self.sup.state, self.log)
        self.own_guard = host.guard is None and cfg.guard.enabled  # a stand-in's is not run
        self.guard = Guard(cfg.guard, self.guard_hooks) if self.own_guard else host.guard
        self.registry = InstanceRegistry(self.config, config_path, self.log)
        self.memory = MemorySampler(cfg, self.clock)
        self.recorder = DaemonRecorder(self.config, self.sup, self.slot, self.memory, self.clock, self.log,
                                       guard=self.guard, group=self.group)
        self.start_guard = StartGuard(self.config, self.memory, self.recorder, self.sup, self.files, self.clock,
                                      self.log, on_phase=self._on_settle)
        self.node = self._node(config_path)
        self._wire_the_rest(config_path)

    def _node(self, config_path: Path | None) -> Node:
        """The lifecycle's effects, each part over the ones built before it."""
        host, plan, clock, log = self.adapters, self.plan, self.clock, self.log
        self.output = VllmOutput(self.config, plan, self.vllm_log, self.sup.post, clock, log)
        record = InstanceRecord(self.config, self.files, self.registry, clock, log)
        self.leftovers = Leftovers(plan, sweep=host.sweep, gpus=host.gpus, clock=clock, log=log)
        local = LocalPreflight(plan, host.checks, self.facts, self.evidence, log)
        evidence = NodeEvidence(self.evidence, self.guard, self.slot, local)
        self.watch_reports = NodeWatchReports(self.config, self.sup, self.output, evidence, group=self.group,
                                              gpu=self.gpu)
        self.watching = Watching(plan, record, self.watch_reports, host.probes or self._probes, self.tasks.spawn,
                                 clock, log)
        self.launcher = Launcher(plan, record, self.facts, self.output, evidence, self.watching, clock, log)
        preflight = Preflight(local, GroupStart(self.group, self.checks), self.leftovers,
                              before_start=self.start_guard.before_start, guard=self.guard, clock=clock)
        self.stops = StopEffects(plan, record, self.output, self.leftovers, clock, log)
        return Node(self.launcher, preflight, self.stops, evidence, group=self.group, post=self.sup.post,
                    spawn=self.tasks.spawn, rand=host.rand)

    def _wire_the_rest(self, config_path: Path | None) -> None:
        """The views and the operator's surface, over the parts built above."""
        self.reloader = Reloader(config_path, self.config, self.config.replace, self.log)
        self.breaker = ConfigBreaker(self.config().paths.state_dir / "breaker-config.json", self.config.launch_hash,
                                     self.sup.post, self.files, self.log)
        self.view = StatusView(self.config, self.sup, self.node, self.clock, daemon=self, guard=self.guard,
                               group=self.group, gpu=self.gpu)
        self.metrics = Metrics(self.view)
        self.metrics.registry.register(RecorderCollector(self.metrics.families, self.recorder, self.start_guard))
        self.control = DaemonControl(self.sup, self.node, self.view, self.group, reload=self.reloader.reload,
                                     handover=self.handover, checks=self.checks)
        self._scope: anyio.CancelScope | None = None
        self._signals_seen = 0
        self.shm_due = anyio.Event()  # vLLM became ready: note what it holds in /dev/shm now
        for listener in (self.breaker.on_transition, self.launcher.on_transition, self._on_transition):
            self.sup.listen(listener)
        self.output.listen(self._on_phase)
        adapters = (self.runtime.configure, self.checks.configure, *((self.group.configure,) if self.group else ()))
        for follower in (*adapters, self.evidence.configure, self.watching.configure, self._configure):
            self.config.follow(follower)

    @property
    def lifecycle_path(self) -> Path:
        return self.cfg.paths.state_dir / "lifecycle.json"

    @property
    def status_path(self) -> Path:
        return self.cfg.paths.state_dir / "status.json"

    def _group(self) -> Coordinator | None:
        if group_role(self.cfg) is None:
            return None
        from sparkd.cluster.coordinator import Coordinator  # a group's only: a single node never loads it
        from sparkd.cluster.peers import PeerClient

        return Coordinator(self.cfg, PeerClient(self.cfg, self.token), post=self.sup.post, state=self.sup.state,
                           image=self.facts.image_json, clock=self.clock, log=self.log, addresses=self.peer_addresses)

    def _probes(self) -> HttpProbes:
        launch, health = self.cfg.launch, self.cfg.health
        return HttpProbes(host=launch.host, port=launch.port, timeout_s=health.timeout_s,
                          canary_timeout_s=health.canary_timeout_s, model=self.cfg.served_name,
                          api_key=api_key(self.cfg))

    def _remember(self, kept: Any) -> None:
        self.files.put(self.lifecycle_path, remembered.to_json(kept, self.clock))

    def problems(self) -> list[str]:
        """What sparkd itself cannot do right now (it reports itself degraded until they clear)."""
        problems = sorted(self.files.problems.values()) + self.recorder.problems()
        if self.vllm_log.write_error:
            problems.append(f"vLLM's output is not being kept on disk: {self.vllm_log.write_error} "
                            f"({self.vllm_log.lost_lines} line(s) lost)")
        return problems

    def more(self) -> Extras:
        """The flight recorder's and the memory settle's status."""
        extra: Extras = {"recorder": {**self.recorder.status(), **self.start_guard.status()}}
        if self.recorder.phase is not None:
            extra["phase"] = self.recorder.phase
        return extra

    def proofs(self) -> Checks:
        return self.checks.status()

    def _on_settle(self, phase: str | None) -> None:
        """The memory settle is a phase of the preflight: in status, its history and `restart --wait`."""
        if phase is not None:
            self.view.note_phase(phase)
        self.publish()

    @property
    def cfg(self) -> Config:
        return self.config()

    def _configure(self, cfg: Config) -> None:
        """A reloaded config (``CurrentConfig.replace``): what the daemon derives from it, then the breaker."""
        self.sup.configure(limits_from(cfg))
        self.vllm_log.configure(cfg.supervisor.log_max_bytes, cfg.supervisor.log_backups)
        configure_logging(cfg.log)
        if self.guard is not None:
            self.guard.configure(cfg.guard)
        self.breaker.check(self.sup.machine)
        self.publish()

    def _on_transition(self, before: Machine, after: Machine, obs: v.Observation) -> None:
        if after.state is State.ready and before.state is not State.ready:
            self.shm_due.set()
        self.publish()

    def _on_phase(self, startup: Startup) -> None:
        self.publish()

    def config_state(self) -> dict[str, Any]:
        """The config on disk against the one loaded and the one the running vLLM was launched from."""
        disk = self.reloader.on_disk()
        breaker = {"breaker": self.breaker.note} if self.breaker.note else {}
        if disk is None:
            return {"path": None, **breaker}
        path = str(self.reloader.path)
        if isinstance(disk, list):
            return {"path": path, "valid": False, "problems": disk, **breaker}
        loaded, on_disk = self.cfg.launch_hash(), disk.launch_hash()
        running = self.node.instance.config_hash if self.node.instance is not None else None
        return {"path": path, "valid": True, "hash_on_disk": on_disk, "hash_loaded": loaded, "hash_running": running,
                "reload_needed": disk != keep_fixed(self.cfg, disk) or on_disk != loaded,
                "restart_needed": running is not None and running != on_disk, **breaker}

    def handover(self) -> None:
        """Exit now and leave vLLM running, for the next sparkd to adopt (a package upgrade)."""
        self.log.info("handover", pid=self.node.instance.pid if self.node.instance else None)
        if self._scope is not None:
            self._scope.cancel()

    def publish(self) -> None:
        """status.json and the systemd STATUS line, after every change."""
        self.files.put(self.status_path, self.view.status)  # rendered when written: once per burst of changes
        if self.sup.booted.is_set():  # READY=1 carries the first STATUS=
            self.notifier.status(self.view.line())

    async def run(self, sockets: Sockets | None = None) -> int:
        """Run until a shutdown finds nothing running (``sockets`` None: no control API, for in-process tests)."""
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
                if self.cfg.recorder.enabled:
                    tg.start_soon(self.recorder.run)
                tg.start_soon(self._signals, tg.cancel_scope)
                tg.start_soon(self._watchdog)
                tg.start_soon(self.gpu.run)
                tg.start_soon(self._note_shm)
                self.registry.write()
                self.publish()
                await self.sup.run(self.node, boot=self._boot)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                self.files.put(self.status_path, self.view.status())
                await self.files.flush()
                if self.cfg.recorder.enabled:
                    await self.recorder.close()
            if sockets is not None:
                self.cfg.paths.socket.unlink(missing_ok=True)
            self.registry.remove()
            self.vllm_log.close()
        self.log.info("daemon_exit", state=self.sup.machine.state.value)
        return exits.OK

    def _serve(self, tg: TaskGroup, sockets: Sockets) -> None:
        start_servers(tg, sockets.unix, sockets.tcp, self.control, self.metrics.render, cfg=self.cfg, token=self.token,
                      peers=self.peer_addresses, tls=self.trusted.tls, log=self.log)

    async def _boot(self) -> bool:
        found = await self.launcher.adopt()
        self.notifier.ready(self.view.line())
        return found

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                await self.sup.booted.wait()
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    self.log.info("signal", signal=name, action="reload")
                    await self.reloader.reload()
                    continue
                self._signals_seen += 1
                leave = self.cfg.supervisor.leave_running
                self.log.info("signal", signal=name, leave_running=leave, forced=self._signals_seen > 1)
                self.notifier.stopping()
                if leave:
                    scope.cancel()
                elif self._signals_seen == 1:
                    self.sup.shutdown()
                else:
                    await self.stops.hurry()

    async def _note_shm(self) -> None:
        """What the instance holds in /dev/shm, noted every SHM_NOTE_S and right after it becomes ready."""
        while True:
            with anyio.move_on_after(SHM_NOTE_S):
                await self.shm_due.wait()
            self.shm_due = anyio.Event()
            await self.leftovers.note_shm()
            self.registry.write()  # another instance's unit may have cleared /run/sparkd meanwhile

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.notifier.pet(self.sup.alive_at, self.clock.now())
            await self.clock.sleep(interval)


def run_daemon(cfg: Config, *, config_path: Path, rehearse: bool = False) -> int:
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
