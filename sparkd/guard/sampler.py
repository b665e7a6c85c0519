"""The sampler: reads the sources into a :class:`Sample` and decides how long to sleep before the next one.

The interval adapts like earlyoom's, but tighter (earlyoom: headroom / 6000 MiB/s, clamped 100 ms–1 s):
it is the distance from MemAvailable to the next floor that acts (stop, or kill once under stop) divided
by ``fill_rate``, the fastest the pool plausibly drains (the field saw 29 → 2.5 GiB in 9 s), clamped to
``min_interval_s``–``max_interval_s``. Once a floor is crossed, the samples the debounce counts come at
``min_interval_s``. While vLLM starts or profiles (the phase that wedged hosts despite
``gpu_memory_utilization``) it never exceeds ``starting_interval_s``. A kernel PSI trigger, where permitted,
cuts a sleep short the moment the kernel sees a stall.

Sources other than `/proc/meminfo` are optional: a node without PSI or a readable kernel log is still
guarded, on MemAvailable alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import anyio

from sparkd.config import GuardConfig
from sparkd.guard.kmsg import KernelLog
from sparkd.guard.meminfo import MeminfoReader
from sparkd.guard.psi import PressureReader, PsiTrigger
from sparkd.guard.sample import Sample

__all__ = ["Sampler", "next_interval"]


def next_interval(available: int, cfg: GuardConfig, *, starting: bool, debouncing: bool = False) -> float:
    """Seconds until the next sample. Pure. ``debouncing``: a floor is crossed and the guard is counting
    samples before it acts on it; those come at ``min_interval_s``."""
    if debouncing:
        return cfg.min_interval_s
    floor = cfg.stop_below if available >= cfg.stop_below else cfg.kill_below
    distance = available - floor
    interval = distance / cfg.fill_rate if distance > 0 else 0.0
    if starting and interval > cfg.starting_interval_s:
        interval = cfg.starting_interval_s
    if interval < cfg.min_interval_s:
        return cfg.min_interval_s
    return interval if interval < cfg.max_interval_s else cfg.max_interval_s


class Sampler:
    """Holds the sources open. Use as a context manager, or call :meth:`close`."""

    def __init__(self, cfg: GuardConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        """``cfg``: the sources it opens (what a running daemon keeps until it restarts)."""
        self.clock = clock
        self.meminfo = MeminfoReader(cfg.meminfo_path)  # the one source the guard cannot do without
        self.pressure: PressureReader | None = None
        self.trigger: PsiTrigger | None = None
        self.kernel: KernelLog | None = None
        self.problems: list[str] = []  # why an optional source is off, for the startup log
        try:
            self.pressure = PressureReader(cfg.pressure_path)
        except (OSError, ValueError) as exc:
            self.problems.append(f"PSI off ({cfg.pressure_path}: {exc})")
        if self.pressure is not None and cfg.psi_trigger:
            self.trigger = PsiTrigger.register(cfg.pressure_path, cfg.psi_trigger)
            if self.trigger is None:
                self.problems.append(f"PSI trigger {cfg.psi_trigger!r} not permitted; polling only")
        if cfg.kernel_log:
            self.kernel = KernelLog.open(cfg.kmsg_path)
            if self.kernel is None:
                self.problems.append(f"kernel log off ({cfg.kmsg_path} unreadable)")

    def read(self, vllm_pids: Collection[int] = ()) -> Sample:
        """One sample now. ``vllm_pids`` lets an OOM-kill line name vLLM by PID as well as by title."""
        mem = self.meminfo.read()
        psi = None
        if self.pressure is not None:
            try:
                psi = self.pressure.read()
            except (OSError, ValueError):
                psi = None
        kernel = self.kernel
        if kernel is None:
            return Sample(self.clock(), mem, psi)
        kernel.drain(vllm_pids)
        return Sample(self.clock(), mem, psi, kernel.nvrm_errors, kernel.vllm_oom_kills)

    async def wait(self, interval_s: float) -> bool:
        """Sleep ``interval_s``, or less if the PSI trigger fires first (then True)."""
        if self.trigger is None:
            await anyio.sleep(interval_s)
            return False
        try:
            return await self.trigger.wait(interval_s)
        except OSError as exc:
            self.problems.append(str(exc))
            self.trigger.close()
            self.trigger = None
            return False

    def close(self) -> None:
        self.meminfo.close()
        for source in (self.pressure, self.trigger, self.kernel):
            if source is not None:
                source.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
