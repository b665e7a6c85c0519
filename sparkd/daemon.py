"""The daemon for one node: observations in, the pure state machine decides, effects out.

Everything here is the imperative shell around :func:`sparkd.supervisor.machine.step`: it turns the world
(process exits, log lines, probe results, signals, operator requests, time) into observations, applies
them one at a time from a single queue, and carries out the actions the machine returns.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from sparkd.api.server import bind_tcp_socket, bind_unix_socket, build_app, build_tcp_app, read_token, serve
from sparkd.cluster.coordinator import Coordinator
from sparkd.cluster.peers import PeerClient
from sparkd.config import Config, Role
from sparkd.guard.guard import Guard
from sparkd.guard.wiring import DaemonGuardHooks, start_refusal
from sparkd.incidents import incident_record, write_incident
from sparkd.launch import LaunchSpec, render
from sparkd.logs import VllmLog, configure_logging, get_logger
from sparkd.metrics import DaemonCounters, Metrics
from sparkd.nodelock import AlreadyRunning, NodeLock
from sparkd.notify import Notifier
from sparkd.preflight.runner import (
    PreflightContext,
    PreflightReport,
    check_shm,
    check_stale_processes,
    run_preflight,
)
from sparkd.reporting import Reporter
from sparkd.runtime import make_runtime
from sparkd.runtime.base import Instance, LaunchError, Runtime
from sparkd.statefile import read_json, write_json
from sparkd.supervisor import machine as sm
from sparkd.supervisor.classify import ClassifyContext, classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import HealthTracker, VllmMetrics
from sparkd.supervisor.machine import State
from sparkd.supervisor.policy import RestartPolicy
from sparkd.supervisor.progress import Progress, advance, is_progress
from sparkd.watch import InstanceWatch

TICK_S = 1.0


def limits_from(cfg: Config) -> sm.Limits:
    r = cfg.restart
    return sm.Limits(
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
    )


def rehearsal(spec: LaunchSpec) -> LaunchSpec:
    """The same launch with the stand-in in place of vLLM: same flags, same environment."""
    argv = spec.argv
    rest = argv[2:] if argv[0] == "bash" else argv[1:]
    return LaunchSpec(argv=(sys.executable, "-m", "sparkd.standin", *rest), env=spec.env,
                      config_hash=spec.config_hash)


class Daemon:
    def __init__(self, cfg: Config, runtime: Runtime, *, rehearse: bool = False) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.rehearse = rehearse
        self.pair = pair_role(cfg)
        self.limits = replace(limits_from(cfg), led=self.pair == "worker")
        self.token = read_token(cfg.api.token_file)
        self.coordinator: Coordinator | None = None
        self.image_id: str | None = None  # the configured image's id, compared across the pair
        self.machine = sm.Machine()
        self._log = get_logger(node=cfg.node.name, role=cfg.node.role.value)
        self.vllm_log = VllmLog(cfg.paths.logs / "vllm.log", max_bytes=cfg.supervisor.log_max_bytes,
                                backups=cfg.supervisor.log_backups)
        self.instance: Instance | None = None
        self.watch: InstanceWatch | None = None
        self.health = HealthTracker()
        self.progress = Progress()
        self.failure_at: float | None = None
        self.last_preflight: list[dict[str, object]] = []
        self._send, self._recv = anyio.create_memory_object_stream[sm.Observation](1000)
        self._busy = anyio.Lock()  # launch and stop never overlap
        self._preflight_scope: anyio.CancelScope | None = None
        self._shutdown = False
        self._tg: TaskGroup | None = None
        self.counters = DaemonCounters()
        self.metrics = Metrics(self)
        self.report = Reporter(self)
        self.notifier = Notifier()
        self.loop_alive_at = time.monotonic()  # the watchdog pets only while this moves
        self.guard: Guard | None = None
        self.last_vllm_metrics: VllmMetrics | None = None
        self.recorded: set[int] = set()  # failures whose incident is written already (by the guard)
        self.next_stop_grace_s: float | None = None  # the guard's grace for the stop it asked for

    @property
    def log(self) -> Any:
        """The daemon's logger; every event carries the node, the role and the current state."""
        return self._log.bind(state=self.machine.state.value)

    # ---- paths
    @property
    def record_path(self) -> Path:
        return self.cfg.paths.state_dir / "instance.json"

    @property
    def status_path(self) -> Path:
        return self.cfg.paths.state_dir / "status.json"

    def post(self, obs: sm.Observation) -> None:
        self._send.send_nowait(obs)

    # ---- main loop
    async def run(self) -> int:
        for folder in (self.cfg.paths.state_dir, self.cfg.paths.run_dir, self.cfg.paths.logs):
            folder.mkdir(parents=True, exist_ok=True)
        try:
            lock = NodeLock(self.cfg.paths.state_dir / "sparkd.lock")
            lock.acquire()
        except AlreadyRunning as exc:
            self.log.error("already_running", detail=str(exc))
            return 1
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._start_servers(tg)
                self.image_id = await self.runtime.configured_image_id()
                if self.cfg.guard.enabled:
                    self.guard = Guard(self.cfg.guard, DaemonGuardHooks(self))
                    await tg.start(self.guard.run)
                if self.pair:
                    self.coordinator = Coordinator(self, PeerClient(self.cfg, self.token))
                    tg.start_soon(self.coordinator.watch)
                tg.start_soon(self._signals)
                tg.start_soon(self._ticker)
                tg.start_soon(self._watchdog)
                self.report.write()
                await self._adopt()
                self.notifier.ready(self.report.status_line())
                async for obs in self._recv:
                    self.apply(obs)
                    if self._shutdown and self._quiescent():
                        break
                tg.cancel_scope.cancel()
        finally:
            self.cfg.paths.socket.unlink(missing_ok=True)
            lock.release()
            self.vllm_log.close()
        self.log.info("daemon_exit", state=self.machine.state.value)
        return 0

    def _start_servers(self, tg: TaskGroup) -> None:
        api = self.cfg.api
        tg.start_soon(serve, build_app(self), bind_unix_socket(self.cfg.paths.socket, group=api.socket_group))
        if api.port:
            if api.token_file is not None and self.token is None:
                self.log.error("token_unreadable", path=str(api.token_file))
            tg.start_soon(serve, build_tcp_app(self, self.token), bind_tcp_socket(api.listen, api.port))

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.notifier.pet(self.loop_alive_at)
            await anyio.sleep(interval)

    def now(self) -> float:
        return time.monotonic()

    def _quiescent(self) -> bool:
        if self.cfg.supervisor.leave_running:
            return True
        return self.machine.state in (State.stopped, State.failed, State.backoff) and self.instance is None

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.log.info("signal", signal=signal.Signals(signum).name,
                              leave_running=self.cfg.supervisor.leave_running)
                self._shutdown = True
                self.notifier.stopping()
                if self.cfg.supervisor.leave_running:
                    self.post(sm.Tick())
                else:
                    self.post(sm.StopRequested())

    async def _ticker(self) -> None:
        """Time for the machine's deadlines: every TICK_S, and right at a backoff's end."""
        while True:
            deadline = self.machine.deadline
            delay = TICK_S if deadline is None else min(TICK_S, max(0.01, deadline - time.monotonic()))
            await anyio.sleep(delay)
            self.post(sm.Tick())

    async def _adopt(self) -> None:
        record = read_json(self.record_path)
        instance = await self.runtime.find(record)
        if instance is not None:
            self.log.info("adopted", pid=instance.pid, container=instance.container_id)
            self._attach(instance, adopted=True)
        else:
            if record is not None:
                self.record_path.unlink(missing_ok=True)
        self.post(sm.Adopted(found=instance is not None))

    # ---- applying observations
    def apply(self, obs: sm.Observation) -> None:
        before = self.machine
        now = time.monotonic()
        self.loop_alive_at = now
        after, actions = sm.step(before, obs, now, self.limits)
        self.machine = after
        if after.state is not before.state:
            self.report.remember(state=after.state.value)
            self.report.count_transition(before, after, now)
            failure = after.pending or (after.last_failure if after.state is State.failed else None)
            self.log.info("transition", **{"from": before.state.value}, to=after.state.value,
                          observation=type(obs).__name__,
                          **({"failure": failure.cls.value, "reason": failure.sentence} if failure else {}),
                          **({"backoff_s": round(after.deadline - after.since, 1)} if after.deadline else {}))
        if after.state is not State.preflight and self._preflight_scope is not None:
            self._preflight_scope.cancel()
        for action in actions:
            self._act(action)
        if after is not before:
            self.report.write()
            self.notifier.status(self.report.status_line())

    def _act(self, action: sm.Action) -> None:
        assert self._tg is not None
        if isinstance(action, sm.RunPreflight):
            self._tg.start_soon(self._preflight)
        elif isinstance(action, sm.Launch):
            self._tg.start_soon(self._launch)
        elif isinstance(action, sm.Stop):
            self._tg.start_soon(self._stop, action.reason)
        elif isinstance(action, sm.RecordIncident):
            self._record_incident(action.failure)

    # ---- effects
    def spec(self) -> LaunchSpec:
        spec = render(self.cfg)
        return rehearsal(spec) if self.rehearse else spec

    async def run_preflight_now(self, *, dry_run: bool) -> PreflightReport:
        """An operator's preflight (sparkctl preflight): never touches the watched instance."""
        protect = frozenset(self.runtime.pids(self.instance)) if self.instance else frozenset()
        ctx = PreflightContext(cfg=self.cfg, spec=self.spec(), runtime=self.runtime, protect=protect,
                               dry_run=dry_run)
        return await run_preflight(ctx)

    async def _preflight(self) -> None:
        """This node's checks; on a pair's head also every worker's (in parallel), then the workers start."""
        with anyio.CancelScope() as scope:
            self._preflight_scope = scope
            failures: list[Failure | None] = [None, None]

            async def local() -> None:
                report = await run_preflight(PreflightContext(cfg=self.cfg, spec=self.spec(), runtime=self.runtime))
                self.last_preflight = report.to_json()
                for result in report.results:
                    self.log.info("preflight", check=result.id, verdict=result.verdict.value, found=result.found,
                                  did=result.did, duration_s=round(result.duration_s, 3))
                failures[0] = report.failure()

            async def workers() -> None:
                if self.pair == "head" and self.coordinator is not None:
                    failures[1] = await self.coordinator.check_and_clean_workers()

            async with anyio.create_task_group() as tg:
                tg.start_soon(local)
                tg.start_soon(workers)
            failure = start_refusal(self.guard) or failures[0] or failures[1]
            if failure is None and self.pair == "head" and self.coordinator is not None:
                failure = await self.coordinator.start_workers()
            self.post(sm.PreflightDone(failure))
        self._preflight_scope = None

    async def _launch(self) -> None:
        async with self._busy:
            spec = self.spec()
            self.progress = Progress()
            self.vllm_log.append(f"---- sparkd: launch {' '.join(spec.argv)}")
            try:
                instance = await self.runtime.launch(spec)
            except LaunchError as exc:
                cls = FailureClass.config_error if exc.exit_code in (126, 127) else FailureClass.unknown
                self.post(sm.LaunchFailed(Failure(cls=cls, sentence=f"The launch failed: {exc}",
                                                  exit_code=exc.exit_code, signal=None, evidence=str(exc))))
                return
            self.log.info("launched", pid=instance.pid, container=instance.container_id, argv=list(spec.argv))
            self._attach(instance, adopted=False)
            self.post(sm.Launched())

    def _attach(self, instance: Instance, *, adopted: bool) -> None:
        assert self._tg is not None
        self.instance = instance
        write_json(self.record_path, instance.to_record())
        self.watch = InstanceWatch(self, instance, replay=adopted)
        self._tg.start_soon(self.watch.run)

    async def _stop(self, reason: str) -> None:
        async with anyio.create_task_group() as tg:
            if self.pair == "head" and self.coordinator is not None:
                tg.start_soon(self.coordinator.stop_workers)
            tg.start_soon(self._stop_local, reason)
        self.post(sm.StopDone(rand=random.random()))

    async def _stop_local(self, reason: str) -> None:
        async with self._busy:
            instance, watch = self.instance, self.watch
            grace, self.next_stop_grace_s = self.next_stop_grace_s, None
            if instance is not None:
                info = await self.runtime.stop(instance, self.cfg.supervisor.stop_grace_s if grace is None else grace)
                self.log.info("stopped", pid=instance.pid, reason=reason, exit=info.describe())
                if watch is not None:
                    await watch.close()
                self.instance, self.watch = None, None
                self.record_path.unlink(missing_ok=True)
            ctx = PreflightContext(cfg=self.cfg, spec=self.spec(), runtime=self.runtime)
            for check in (check_stale_processes, check_shm):
                result = await check(ctx)
                if result.verdict.value != "ok":
                    self.log.info("sweep", check=result.id, found=result.found, did=result.did)

    def note_failure(self, failure: Failure) -> float:
        """Count a failure and stamp its time; returns the wall time."""
        self.failure_at = at = time.time()
        self.counters.failures[failure.cls.value] += 1
        if failure.exit_code is not None:
            self.counters.last_exit_code = failure.exit_code
        return at

    def _record_incident(self, failure: Failure) -> None:
        if id(failure) in self.recorded:  # the guard wrote it before its kill
            self.recorded.discard(id(failure))
            return
        at = self.note_failure(failure)
        record = incident_record(failure, at=at, config_hash=self.cfg.launch_hash(),
                                 node=self.cfg.node.name, state=self.machine.state.value,
                                 pid=self.instance.pid if self.instance else None,
                                 preflight=self.last_preflight)
        if self._tg is not None:
            self._tg.start_soon(self._write_incident, record, self.instance)
            if self.pair == "worker" and self.coordinator is not None:
                self._tg.start_soon(self.coordinator.report_failure, failure)

    async def _write_incident(self, record: dict[str, Any], instance: Instance | None) -> None:
        container = await self.runtime.inspect(instance) if instance is not None else None
        try:
            folder = write_incident(self.cfg.paths.incidents, record, log_tail=self.vllm_log.last(300),
                                    keep=self.cfg.supervisor.incidents_keep, container=container)
        except OSError as exc:
            self.log.error("incident_write_failed", error=str(exc))
            return
        self.log.warning("incident", failure=record["class"], reason=record["message"], folder=str(folder))

    # ---- called by the instance watch
    def context(self) -> ClassifyContext:
        spec = render(self.cfg)
        target = spec.argv[1] if spec.argv[0] == "bash" else spec.argv[0]
        return ClassifyContext(launch_target=target, api_port=self.cfg.launch.port,
                               master_port=self.cfg.master_port if self.cfg.nnodes > 1 else None,
                               was_ready=self.machine.restart_state.ready_since is not None)

    def on_log_line(self, line: str, *, persist: bool = True) -> None:
        self.vllm_log.append(line, persist=persist)
        if not is_progress(line):
            return
        before = self.progress
        self.progress = advance(before, line, time.monotonic())
        if self.progress is before:
            return
        self.post(sm.Progress())
        if self.headless and self.progress.distributed_ready and not before.distributed_ready:
            self.post(sm.BecameReady())
        if self.progress.phase is not before.phase:
            self.report.remember(state=self.machine.state.value, phase=self.progress.phase.value)
            self.log.info("phase", phase=self.progress.phase.value)
            self.report.write()

    @property
    def headless(self) -> bool:
        return self.cfg.node.role is Role.worker or self.cfg.headless

    def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None) -> Failure:
        return classify(exit_code, sig, self.vllm_log.last(300), hint=hint, context=self.context())

    def status(self) -> dict[str, Any]:
        return self.report.status()

    def extra_metrics(self) -> Iterator[Any]:
        return self.report.extra_metrics()

    def refusal(self, action: str) -> str | None:
        """Why an operator action is refused now, or None."""
        if action == "start" and self.machine.state is State.failed:
            return (f"the restart breaker is open ({self.machine.restart_state.breaker_reason}); "
                    "use `sparkctl reset` or `sparkctl restart`")
        if self._shutdown:
            return "sparkd is shutting down"
        return None

    def vllm_left(self) -> list[int]:
        """PIDs of vLLM processes still on this node (titled with this launch's prefix)."""
        from sparkd.preflight.stale import find_stale, title_prefix

        return [p.pid for p in find_stale(prefix=title_prefix(self.spec().env))]

    async def wait_state(self, done: Callable[[], bool], timeout_s: float) -> bool:
        with anyio.move_on_after(timeout_s):
            while not done():
                await anyio.sleep(0.05)
            return True
        return False

def pair_role(cfg: Config) -> str | None:
    """"head" or "worker" when this node is one rank of a multi-node pair with peers; else None."""
    if not cfg.cluster.peers or cfg.nnodes <= 1 or cfg.node.role is Role.single:
        return None
    return cfg.node.role.value


def run_daemon(cfg: Config, *, config_path: Path, rehearse: bool = False) -> int:
    configure_logging()
    runtime = make_runtime(cfg, rehearse=rehearse)
    daemon = Daemon(cfg, runtime, rehearse=rehearse)
    daemon.log.info("starting", config=str(config_path), runtime=cfg.runtime.value, rehearse=rehearse,
                    launch_hash=cfg.launch_hash())
    return anyio.run(daemon.run)
