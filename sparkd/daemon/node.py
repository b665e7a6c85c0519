"""This node's vLLM: the lifecycle's effects (preflight, launch, stop, incidents), carried out on the parts the
daemon built before it: the instance slot (the instance, its watch, its startup progress), the container's facts
(image, drift), the failure evidence and the launch plan (:mod:`sparkd.daemon.plan`).

The :class:`Node` posts each outcome back as an observation and decides nothing about the lifecycle. It keeps the
instance record (``instance.json``) and the host copy of vLLM's output. On a group's head it prepares, starts and
stops the workers beside its own rank; on a worker it tells the head at once when its rank fails.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import psutil

from sparkd.cluster.coordinator import Coordinator
from sparkd.config import Config, Role
from sparkd.daemon.current import CurrentConfig
from sparkd.daemon.evidence import LAUNCH_LINE, FailureEvidence
from sparkd.daemon.facts import ContainerFacts
from sparkd.daemon.files import StateWriter
from sparkd.daemon.gpurelease import GpuRelease
from sparkd.daemon.gpuwatch import GpuSampler
from sparkd.daemon.groupchecks import GroupChecks
from sparkd.daemon.guarding import start_refusal
from sparkd.daemon.plan import LaunchPlan
from sparkd.daemon.registry import InstanceRegistry
from sparkd.daemon.slot import InstanceSlot
from sparkd.daemon.stopreport import StopReport, grace_for
from sparkd.daemon.timing import LaunchTiming
from sparkd.daemon.watch import InstanceWatch, Probes
from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock
from sparkd.host.gpu.model import GpuView
from sparkd.host.gpu.reading import read_gpus
from sparkd.host.logs import VllmLog
from sparkd.launch.redact import Redactor
from sparkd.launch.render import health_settings
from sparkd.preflight.base import Check
from sparkd.preflight.processes import launch_places
from sparkd.preflight.runner import (
    DEFAULT_CHECKS,
    PreflightReport,
    check_shm,
    check_stale_processes,
    run_preflight,
)
from sparkd.preflight.shmholders import LEDGER_NAME, ShmLedger
from sparkd.runtime.base import Instance, LaunchError, Runtime
from sparkd.runtime.proctree import MARKER_ENV, ProcessIdentity, launch_marker
from sparkd.state.files import json_state
from sparkd.state.schema import INSTANCE
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import topology_of
from sparkd.supervisor.launchfailure import host_refused, launch_refused
from sparkd.supervisor.peerloss import WEDGES, wedge_or_peer_lost
from sparkd.supervisor.progress import Startup, advance, is_progress
from sparkd.supervisor.states import Machine, State


class Node:
    def __init__(
        self, config: CurrentConfig, runtime: Runtime, *, post: Callable[[v.Observation], None],
        state: Callable[[], State], clock: Clock, log: Any, spawn: Callable[..., None], vllm_log: VllmLog,
        files: StateWriter, probes: Callable[[], Probes], slot: InstanceSlot, facts: ContainerFacts,
        evidence: FailureEvidence, registry: InstanceRegistry | None = None, group: Coordinator | None = None,
        guard: Guard | None = None, rand: Callable[[], float] = random.random, rehearse: bool = False,
        checks: tuple[Check, ...] = DEFAULT_CHECKS, sweep: tuple[Check, ...] = (check_stale_processes, check_shm),
        before_start: Callable[[], Awaitable[Failure | None]] | None = None,
        group_checks: GroupChecks | None = None, gpus: Callable[[], Awaitable[GpuView]] = read_gpus,
        gpu: GpuSampler | None = None,
    ) -> None:
        self.config = config  # current_config(): a reload changes what the next action reads
        self.runtime = runtime
        self.post = post
        self.state = state
        self.clock = clock
        self.log = log
        self._spawn = spawn
        self.vllm_log = vllm_log
        self.files = files
        self.probes = probes
        self.slot = slot  # the instance and its watch
        self.facts = facts  # the image and the container's drift
        self.evidence = evidence
        self.registry = registry  # the host's instance registry
        self.group = group
        self.guard = guard
        self.rand = rand
        self.plan = LaunchPlan(config, runtime, slot, rehearse=rehearse)  # what it launches, read afresh
        self.instance_file = json_state(self.cfg.paths.state_dir / "instance.json", INSTANCE, log=log,
                                        clock=clock.wall)
        self.ledger = ShmLedger(self.cfg.paths.state_dir / LEDGER_NAME, log=log, clock=clock.wall)
        self.checks = checks  # before every launch
        self.sweep = sweep  # after every stop
        self.before_start = before_start  # the memory settle and the restart gate (sparkd/daemon/settling.py)
        self.group_checks = group_checks  # a head's fabric and weights proofs before a start
        self.gpus = gpus  # the node's GPUs now (NVML): the release after a stop is verified against them
        self.gpu = gpu  # the launch's GPUs: a wedge verdict carries their power
        self.last_stop: StopReport | None = None
        self.release = GpuRelease(gpus, clock, log)  # after every stop, and before a launch while it is not back
        self.last_preflight: list[dict[str, object]] = []
        self.timing: LaunchTiming | None = None  # the current (or last) launch's, for status and metrics
        self.phase_listeners: list[Callable[[Startup], None]] = []
        self._busy = anyio.Lock()  # launch and stop never overlap

    @property
    def cfg(self) -> Config:
        return self.config()

    @property
    def redact(self) -> Redactor:
        return self.config.redact  # secrets never reach a log, an incident or `sparkctl logs`

    @property
    def instance(self) -> Instance | None:
        return self.slot.instance

    @property
    def watch(self) -> InstanceWatch | None:
        return self.slot.watch

    @property
    def startup(self) -> Startup:
        return self.slot.startup

    def configure(self, cfg: Config) -> None:
        """A reloaded config: the watch's health settings apply at once."""
        if self.watch is not None:
            self.watch.configure(health_settings(cfg))

    def on_transition(self, before: Machine, after: Machine, obs: v.Observation) -> None:
        """Ready: the launch's timing is complete, logged once (``start_timing``)."""
        if after.state is State.ready and before.state is State.starting:
            timing = self.timing
            if timing is not None and timing.ready_at is None:
                timing.ready_at = after.since
                self.log.info("start_timing", **timing.to_json())

    @property
    def record_path(self) -> Path:
        return self.cfg.paths.state_dir / "instance.json"

    @property
    def role(self) -> Role | None:
        return self.group.role if self.group is not None else None

    # ---- boot
    async def adopt(self) -> bool:
        """Find the instance this node launched before sparkd (re)started and watch it again."""
        await self.facts.read_image()
        record = self.instance_file.read()  # a bad record is set aside, logged, and treated as absent
        try:
            instance = await self.runtime.find(record)
        except Exception as exc:  # the engine is down at boot: nothing to adopt now; the record stays
            self.log.warning("adoption_impossible", error=str(exc), record=str(self.record_path))
            return False
        if instance is not None and record is not None and not self.plan.proven(record):
            self.log.warning("record_not_proven", pid=instance.pid, record=str(self.record_path),
                             why="the process the record names does not carry this node's launch marker and does "
                                 "not run what the config launches; not adopted, not touched")
            instance = None
        if instance is None:
            if record is not None:
                self.files.remove(self.record_path)
            return False
        self.log.info("adopted", pid=instance.pid, container=instance.container_id)
        self.timing = LaunchTiming(requested_at=self.clock.now(), adopted=True)
        self._attach(instance, adopted=True)
        return True

    # ---- the lifecycle's effects
    async def preflight(self) -> None:
        """This node's checks; on a group's head also every worker's (in parallel), then the workers start."""
        timing = self.timing = LaunchTiming(requested_at=self.clock.now())
        stuck = await self.release.gate()
        if stuck is not None:
            self.post(v.PreflightDone(stuck, rand=self.rand()))
            return
        failures: list[Failure | None] = [None, None, None]
        if self.before_start is not None:  # the memory settle and the restart gate, before anything else
            refusal = await self.before_start()
            timing.step("memory_settle", self.clock.now() - timing.requested_at)
            if refusal is not None:
                self.post(v.PreflightDone(refusal, rand=self.rand()))
                return
        lead = self.group_checks if self.role is Role.head else None
        if lead is not None:  # the fabric first: a few seconds, and a bad link fails the start at once
            started = self.clock.now()
            failures[2] = await lead.fabric()
            timing.step("group.fabric", self.clock.now() - started)
            if failures[2] is not None:
                self.post(v.PreflightDone(failures[2], rand=self.rand()))
                return

        async def local() -> None:
            report = await run_preflight(self.plan.context(), self.checks)
            self.last_preflight = report.to_json()
            self.facts.saw_image(report.image)
            await self.facts.read_drift()
            for result in report.results:
                timing.step(f"preflight.{result.id}", result.duration_s)
                log = {"warn": self.log.warning, "fail": self.log.error}.get(result.verdict.value, self.log.info)
                log("preflight", check=result.id, verdict=result.verdict.value, found=result.found, did=result.did,
                    duration_s=round(result.duration_s, 3))
            failures[0] = report.failure()
            self.evidence.log_preflight_failure(report)

        async def workers() -> None:
            if self.role is Role.head and self.group is not None:
                started = self.clock.now()
                failures[1] = await self.group.prepare_workers()
                timing.step("group.prepare_workers", self.clock.now() - started)

        async def weights() -> None:
            if lead is not None:
                started = self.clock.now()
                failures[2] = await lead.weights()
                timing.step("group.weights", self.clock.now() - started)

        async with anyio.create_task_group() as tg:
            tg.start_soon(local)
            tg.start_soon(workers)
            tg.start_soon(weights)
        failure = start_refusal(self.guard) or failures[0] or failures[1] or failures[2]
        if failure is None and self.role is Role.head and self.group is not None:
            started = self.clock.now()
            failure = await self.group.start_workers()
            timing.step("group.start_workers", self.clock.now() - started)
        timing.step("preflight", self.clock.now() - timing.requested_at)
        self.post(v.PreflightDone(failure, rand=self.rand()))

    async def launch(self) -> None:
        async with self._busy:
            spec = self.plan.spec()
            self.slot.progressed(Startup())
            timing = self.timing or LaunchTiming(requested_at=self.clock.now())
            called = self.clock.now()
            timing.step("queue", called - timing.requested_at - timing.steps.get("preflight", 0.0))
            argv = self.redact.argv(spec.argv)
            self.vllm_log.append(f"{LAUNCH_LINE}{' '.join(argv)}")
            marker = launch_marker()  # every process of the launch inherits it: the proof it is ours
            try:
                instance = await self.runtime.launch(replace(spec, env={**spec.env, MARKER_ENV: marker}))
            except LaunchError as exc:
                self.post(v.LaunchFailed(launch_refused(str(exc), unavailable=exc.unavailable,
                                                        exit_code=exc.exit_code)))
                return
            except OSError as exc:  # the host refuses what the launch writes: wait for it, spend no budget
                self.post(v.LaunchFailed(host_refused(str(exc.strerror or exc), exc.filename, repr(exc))))
                return
            instance = self._with_identity(instance, marker)
            self.evidence.mark_launch(self.guard)
            timing.executed(exec_at := self.clock.now())
            timing.step("runtime.launch", exec_at - called)
            self.timing = timing
            self.log.info("launched", pid=instance.pid, container=instance.container_id, argv=argv,
                          sparkd_s=round(exec_at - timing.requested_at, 4))
            self._attach(instance, adopted=False)
            self.post(v.Launched())

    def _with_identity(self, instance: Instance, marker: str) -> Instance:
        try:
            identity = ProcessIdentity.of(instance.pid, marker)
        except (psutil.Error, ValueError):  # it ended already: wait() reports how
            return instance
        return replace(instance, identity=identity.to_record())

    def _attach(self, instance: Instance, *, adopted: bool) -> None:
        cfg = self.cfg
        self.files.write_now(self.record_path, instance.to_record())
        watch = InstanceWatch(
            instance, self.runtime, post=self._from_watch, state=self.state, on_line=self.on_line,
            classify_exit=self.classify_exit, probes=None if self.plan.headless else self.probes(),
            health_cfg=health_settings(self.cfg), clock=self.clock, log=self.log, replay=adopted,
            topology=topology_of(cfg.nnodes, cfg.launch.tensor_parallel_size, cfg.launch.pipeline_parallel_size),
            clients_port=cfg.launch.port if self.runtime.shares_host_network else None)
        self.slot.hold(instance, watch)
        if self.registry is not None:
            self.registry.update(instance)
        self._spawn(watch.run)

    def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                      engine_gone: bool = False) -> Failure:
        """The watch's death, classified with every fact sparkd has (the guard's memory and kernel lines)."""
        return self.evidence.classify_exit(exit_code, sig, hint, engine_gone, guard=self.guard)

    async def stop(self, reason: str, grace_s: float | None, failure: Failure | None = None,
                   hung: bool = False) -> None:
        async with anyio.create_task_group() as tg:
            if self.role is Role.head and self.group is not None:
                tg.start_soon(self.group.stop_workers)
            tg.start_soon(self._stop_local, reason, grace_s, failure, hung)
        self.post(v.StopDone(rand=self.rand()))

    async def _stop_local(self, reason: str, grace_s: float | None, failure: Failure | None = None,
                          hung: bool = False) -> None:
        async with self._busy:
            instance, watch = self.instance, self.watch
            report: StopReport | None = None
            pids: set[int] = set()
            if instance is not None:
                await self.note_shm()  # what it holds now is provably ours once it is gone
                sup = self.cfg.supervisor
                grace, grace_from = grace_for(grace_s, failure, drain_s=sup.stop_grace_s, hung_s=sup.hung_stop_grace_s,
                                              hung=hung)
                pids, started = self.pids() | {instance.pid}, self.clock.now()
                info = await self.runtime.stop(instance, grace)
                report = StopReport(reason, grace, grace_from, self.clock.now() - started, info.describe(),
                                    info.killed, self.clock.wall())
                self.vllm_log.append(report.log_line())
                self.log.info("stopped", pid=instance.pid, reason=reason, exit=info.describe(), grace_s=grace,
                              grace_from=grace_from, sigkilled=list(info.killed), seconds=round(report.seconds, 3))
                if watch is not None:
                    await watch.close()
                self.slot.clear()
                self.files.remove(self.record_path)
            ctx = await launch_places(self.plan.context())
            for check in self.sweep:
                result = await check(ctx)
                if result.verdict.value != "ok":
                    log = {"warn": self.log.warning, "fail": self.log.error}.get(result.verdict.value, self.log.info)
                    log("sweep", check=result.id, verdict=result.verdict.value, found=result.found, did=result.did)
            if self.registry is not None and self.instance is None:
                self.registry.update(None)  # after the sweep: until then its orphans are still this instance's
            if report is not None:  # the GPU memory's release verified, the report kept and put with its incident
                self.last_stop = await self.release.report(report, pids, self.cfg.supervisor.gpu_release_timeout_s)
                if failure is not None:  # beside the loop: the incident may still be being written
                    self._spawn(self.evidence.note_stop, failure, self.last_stop.to_json())

    async def hurry(self) -> None:
        """A second SIGTERM: end the instance now, without waiting out the grace."""
        instance = self.instance
        if instance is not None:
            self.log.warning("forced_stop", pid=instance.pid)
            await self.runtime.stop(instance, 0.0)

    async def record(self, failure: Failure, written: bool) -> None:
        """Count the failure and keep its evidence (the guard wrote its own already); tell the group's head."""
        if self.role is Role.worker and self.group is not None:
            self._spawn(self.group.report_failure, failure)
        await self.evidence.record(failure, written=written, instance=self.instance, preflight=self.last_preflight,
                                   guard=self.guard)

    async def note_shm(self) -> None:
        """Record the /dev/shm segments the instance holds (the sweep removes them only with that proof)."""
        if self.instance is None or not self.runtime.shares_host_ipc:
            return
        pids = self.pids()
        await anyio.to_thread.run_sync(self.ledger.note, pids, Path("/dev/shm"))

    # ---- what the watch tells
    def on_line(self, line: str, persist: bool = True) -> None:
        line = self.redact(line)
        self.vllm_log.append(line, persist=persist)
        if not is_progress(line):
            return
        before = self.startup
        self.slot.progressed(advance(before, line, self.clock.now()))
        if self.startup is before:
            return
        self.post(v.Progress())
        if self.plan.headless and self.startup.distributed_ready and not before.distributed_ready:
            self.post(v.BecameReady())
        if self.startup.phase is not before.phase:
            if self.timing is not None:
                self.timing.phase(self.startup.phase, self.clock.now())
            self.log.info("phase", phase=self.startup.phase.value)
            for listener in self.phase_listeners:
                listener(self.startup)

    def _from_watch(self, obs: v.Observation) -> None:
        """The watch's observations; a wedge carries the GPUs' power, and seen while a peer's sparkd is unreachable
        it is the peer's loss (:func:`sparkd.supervisor.peerloss.wedge_or_peer_lost`)."""
        if isinstance(obs, v.HealthFailed) and obs.failure.cls in WEDGES:
            lost = self.group.unreachable() if self.group is not None else []
            seen = self.gpu.annotate(obs.failure, self.cfg.health.stall_after_s) if self.gpu else obs.failure
            failure = wedge_or_peer_lost(seen, lost)
            obs = replace(obs, failure=failure) if failure.cls in WEDGES else v.HealthFailed(
                failure, obs.grace_s, obs.recorded)
        self.post(obs)

    # ---- for the operator, the guard and the group
    async def operator_preflight(self, *, dry_run: bool) -> PreflightReport:
        """An operator's (or the head's) preflight: never touches the watched instance."""
        report = await run_preflight(self.plan.context(dry_run=dry_run, protect=True), self.checks)
        if not dry_run:
            self.last_preflight = report.to_json()
        return report

    def pids(self) -> set[int]:
        return self.slot.pids()
