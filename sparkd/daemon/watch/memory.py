"""The host's memory as the flight recorder and the restart gate read it, apart from the memory guard's schedule:
MemAvailable, MemFree and swap (one ``preadv`` of ``/proc/meminfo``) and PSI, each reading cheap; the MemAvailable
samples of this boot kept for the memory settle (:mod:`sparkd.daemon.effects.restartgate`)."""

from __future__ import annotations

import contextlib
from collections import deque
from pathlib import Path
from typing import Any

from sparkd.config import Config
from sparkd.guard.meminfo import MemInfo, MeminfoReader
from sparkd.guard.psi import Pressure, PressureReader
from sparkd.guard.sample import Sample
from sparkd.host.clock import Clock

NO_BOOT_ID = "00000000-0000-0000-0000-000000000000"


def read_boot_id(path: Path) -> str:
    """This boot's id (a UUID), or all zeros when it cannot be read."""
    try:
        return path.read_text(encoding="ascii").strip() or NO_BOOT_ID
    except (OSError, UnicodeDecodeError):
        return NO_BOOT_ID


class MemorySampler:
    def __init__(self, cfg: Config, clock: Clock) -> None:
        self.clock = clock
        self.boot = read_boot_id(cfg.recorder.boot_id_path)  # the boot the samples belong to
        self.samples: deque[tuple[float, int]] = deque(maxlen=4096)  # (monotonic, MemAvailable) for the settle
        self.meminfo: MeminfoReader | None = None
        self.pressure: PressureReader | None = None
        with contextlib.suppress(OSError, ValueError):
            self.meminfo = MeminfoReader(cfg.guard.meminfo_path)
        with contextlib.suppress(OSError, ValueError):
            self.pressure = PressureReader(cfg.guard.pressure_path)

    def read(self, taken: Sample | None = None) -> dict[str, Any]:
        """One reading (what could be read of it); its MemAvailable is kept as a sample. ``taken``: the memory
        guard's sample of this moment, used instead of reading the same files again."""
        mem, psi = (taken.mem, taken.psi) if taken is not None else (self._meminfo(), self._pressure())
        out: dict[str, Any] = {}
        if mem is not None:
            out.update(available=mem.mem_available, free=mem.mem_free, swap_used=mem.swap_total - mem.swap_free)
            self.samples.append((self.clock.now(), mem.mem_available))
        if psi is not None:
            out.update(psi_some=psi.some_avg10, psi_full=psi.full_avg10)
        return out

    def driver_residual(self) -> int | None:
        """The driver's share of memory now (meminfo's residual: in no named field), or None when unreadable."""
        mem = self._meminfo()
        return mem.driver_residual if mem is not None else None

    def _meminfo(self) -> MemInfo | None:
        with contextlib.suppress(OSError, ValueError):
            return self.meminfo.read() if self.meminfo is not None else None
        return None

    def _pressure(self) -> Pressure | None:
        with contextlib.suppress(OSError, ValueError):
            return self.pressure.read() if self.pressure is not None else None
        return None

    def close(self) -> None:
        for source in (self.meminfo, self.pressure):
            if source is not None:
                source.close()
