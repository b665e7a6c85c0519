"""A /proc/meminfo of the test's own: the host's lines with MemAvailable and MemFree set by the test, rewritten in
place (a daemon keeps the file open and reads it with one ``preadv``, so it is never replaced by a new file)."""

from __future__ import annotations

import os
from pathlib import Path


class Meminfo:
    def __init__(self, path: Path, available: int) -> None:
        self.path, self.lines = path, Path("/proc/meminfo").read_text().splitlines()
        self.set(available)

    def set(self, available: int) -> None:
        self.available = available
        text = "\n".join(f"{line.split(':')[0]}:{available // 1024:>16} kB"
                         if line.split(":")[0] in ("MemAvailable", "MemFree") else line for line in self.lines) + "\n"
        data = text.encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
