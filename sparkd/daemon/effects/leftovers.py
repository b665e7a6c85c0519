"""What a stop may leave on the host, and its clearing: the /dev/shm segments the instance held (noted while it runs:
the sweep removes a segment only with that proof), the stale processes and segments the sweep finds after every
stop, and the GPU memory the stopped processes held (verified released; while it is not, the next preflight is a
``gpu_error``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from sparkd.config import Config
from sparkd.daemon.effects.gpurelease import GpuRelease
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.host.clock import Clock
from sparkd.host.gpu.model import GpuView
from sparkd.host.logs import Logger
from sparkd.preflight.base import Check
from sparkd.preflight.processes import launch_places
from sparkd.preflight.shmholders import LEDGER_NAME, ShmLedger
from sparkd.supervisor.failures import Failure
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.stopreport import StopReport


class Leftovers:
    def __init__(self, plan: LaunchPlan, state_dir: Path, *, sweep: tuple[Check, ...],
                 gpus: Callable[[], Awaitable[GpuView]], clock: Clock, log: Logger) -> None:
        self.plan = plan
        self.sweep_checks = sweep  # after every stop
        self.log = log
        self.ledger = ShmLedger(state_dir / LEDGER_NAME, log=log, clock=clock.wall)
        self.release = GpuRelease(gpus, clock, log)  # after every stop, and before a launch while it is not back

    async def note_shm(self, instance: Instance | None) -> None:
        """Record the /dev/shm segments ``instance`` holds (the sweep removes them only with that proof)."""
        runtime = self.plan.runtime
        if instance is None or not runtime.shares_host_ipc:
            return
        await anyio.to_thread.run_sync(self.ledger.note, runtime.pids(instance), Path("/dev/shm"))

    async def sweep(self, cfg: Config) -> None:
        """The stale leftovers of this node's launches, cleared; what is not clean is logged."""
        ctx = await launch_places(self.plan.context(cfg))
        for check in self.sweep_checks:
            result = await check(ctx)
            if result.verdict.value != "ok":
                log = {"warn": self.log.warning, "fail": self.log.error}.get(result.verdict.value, self.log.info)
                log("sweep", check=result.id, verdict=result.verdict.value, found=result.found, did=result.did)

    async def released(self, report: StopReport, pids: set[int], timeout_s: float) -> StopReport:
        """``report`` with the stopped processes' GPU memory verified released (at most ``timeout_s``)."""
        return await self.release.report(report, pids, timeout_s)

    async def gate(self) -> Failure | None:
        """Before a preflight: the memory of an earlier stop still held? Then a ``gpu_error``, not a launch."""
        return await self.release.gate()
