"""A /proc/meminfo of the test's own: the host's lines with MemAvailable and MemFree set by the test, rewritten in
place (a daemon keeps the file open and reads it with one ``preadv``, so it is never replaced by a new file)."""

from __future__ import annotations

import os
from pathlib import Path


class Meminfo:
    """MemTotal is the host's with its free memory replaced by the first ``available``: what the test takes off
    MemAvailable later shows where memory the driver keeps shows (meminfo's residual, in no named field)."""

    def __init__(self, path: Path, available: int) -> None:
        self.path, self.lines = path, Path("/proc/meminfo").read_text().splitlines()
        kib = {line.split(":")[0]: int(line.split()[1]) for line in self.lines if line.split()[1:2] != []}
        self.total_kib = kib["MemTotal"] - kib["MemFree"] + available // 1024
        self.set(available)

    def set(self, available: int) -> None:
        self.available = available
        values = {"MemAvailable": available // 1024, "MemFree": available // 1024, "MemTotal": self.total_kib}
        text = "\n".join(f"{line.split(':')[0]}:{values[line.split(':')[0]]:>16} kB"
                         if line.split(":")[0] in values else line for line in self.lines) + "\n"
        data = text.encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
