"""``/dev/shm/psm_<8 hex>`` segments like the ones vLLM's shared-memory ring buffers create.

A segment is created, sized, mapped and touched, and stays mapped while the process lives. It is unlinked on a
clean shutdown and left behind when the process is killed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets

SHM_DIR = "/dev/shm"
SEGMENT_BYTES = 1 << 20  # vLLM's rings are 24-160 MiB; the name and its lifetime are what matter here


class Segment:
    def __init__(self, size: int = SEGMENT_BYTES, directory: str = SHM_DIR) -> None:
        while True:
            self.path = os.path.join(directory, f"psm_{secrets.token_hex(4)}")
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                break
            except FileExistsError:
                continue
        try:
            os.ftruncate(fd, size)
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._map[0:1] = b"\x01"

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def unlink(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
