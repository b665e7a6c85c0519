"""The host's memory as the flight recorder and the restart gate read it, apart from the memory guard's schedule:
MemAvailable, MemFree and swap (one ``preadv`` of ``/proc/meminfo``) and PSI, each reading cheap; the MemAvailable
samples of this boot kept for the memory settle (:mod:`sparkd.daemon.effects.restartgate`)."""

from __future__ import annotations

import contextlib
from collections import deque
from pathlib import Path
from typing import Any

from sparkd.config import Config
from sparkd.guard.meminfo import MeminfoReader
from sparkd.guard.psi import PressureReader
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

    def read(self) -> dict[str, Any]:
        """One reading (what could be read of it); its MemAvailable is kept as a sample."""
        out: dict[str, Any] = {}
        if self.meminfo is not None:
            with contextlib.suppress(OSError, ValueError):
                mem = self.meminfo.read()
                out.update(available=mem.mem_available, free=mem.mem_free, swap_used=mem.swap_total - mem.swap_free)
        if self.pressure is not None:
            with contextlib.suppress(OSError, ValueError):
                psi = self.pressure.read()
                out.update(psi_some=psi.some_avg10, psi_full=psi.full_avg10)
        if "available" in out:
            self.samples.append((self.clock.now(), out["available"]))
        return out

    def close(self) -> None:
        for source in (self.meminfo, self.pressure):
            if source is not None:
                source.close()
