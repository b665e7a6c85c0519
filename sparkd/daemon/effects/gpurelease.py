"""After every stop: is the stopped processes' GPU memory back? The node asks this once the stop and its sweep are
done (bounded by ``[supervisor] gpu_release_timeout_s``), and again before the next preflight while it was not: a
process the driver does not let go of keeps the node from being launched into (``gpu_error``, reboot advice)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

import psutil

from sparkd.host.clock import Clock
from sparkd.host.gpu.model import GpuView
from sparkd.host.gpu.release import Release, wait_released
from sparkd.host.logs import Logger
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.stopreport import StopReport


class GpuRelease:
    def __init__(self, gpus: Callable[[], Awaitable[GpuView]], clock: Clock, log: Logger) -> None:
        self.gpus = gpus
        self.clock = clock
        self.log = log
        self.held: tuple[frozenset[int], float] | None = None  # PIDs whose memory stayed held; when their stop ended

    async def verify(self, pids: set[int], timeout_s: float, stopped_s: float) -> Release:
        """Wait until none of ``pids`` holds GPU memory, at most ``timeout_s``; remember them if some still do."""
        release = await wait_released(self.gpus, pids, timeout_s, now=self.clock.now, sleep=self.clock.sleep)
        self.held = None if release.released else (frozenset(pids), self.clock.now() - stopped_s)
        (self.log.info if release.released else self.log.error)(
            "gpu_release", released=release.released, seconds=round(release.seconds, 3), detail=self.sentence(release))
        return release

    async def report(self, report: StopReport, pids: set[int], timeout_s: float) -> StopReport:
        """``report`` with the release of the stopped processes' GPU memory, verified."""
        release = await self.verify(pids, timeout_s, report.seconds)
        return replace(report, release=self.sentence(release), released=release.released if release.checked else None)

    def sentence(self, release: Release) -> str:
        return release.sentence(states(h.pid for h in release.held))

    async def gate(self) -> Failure | None:
        """Before a preflight: the memory of an earlier stop still held? Then a ``gpu_error``, not a launch."""
        if self.held is None:
            return None
        pids, stopped_at = self.held
        release = await wait_released(self.gpus, pids, 0.0, now=self.clock.now, sleep=self.clock.sleep)
        if release.released:
            self.held = None
            return None
        release = replace(release, seconds=self.clock.now() - stopped_at)
        return Failure.of(FailureClass.gpu_error, self.sentence(release) + ".",
                          evidence=f"GPU memory still held by PID {', '.join(str(h.pid) for h in release.held)}")


def states(pids: Iterable[int]) -> dict[int, str]:
    """The kernel's state of each PID that still exists (disk-sleep: stuck in the driver)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).status()
        except psutil.Error:
            continue
    return out
