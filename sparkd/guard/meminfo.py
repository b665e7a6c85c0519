"""`/proc/meminfo`: the node's memory as the guard sees it.

Two ways in, one result (:class:`MemInfo`, bytes):

- :func:`parse_meminfo` parses any text (fixtures, a copy in an incident folder). Plain and obvious.
- :class:`MeminfoReader` is the hot path the sampler runs up to 100 times a second: the file stays open,
  ``os.preadv`` fills a preallocated buffer, and the wanted keys are found with ``bytearray.find`` in the
  order the kernel prints them (fixed per boot), each search starting where the previous key ended. The
  only allocations left are the ints themselves and the result tuple (see tests/bench/bench_guard.py).

On GB10 the GPU allocates from the same pool through the driver, and that memory shows up in no named
field. It is the residual ``MemTotal − MemFree − Active − Inactive − Slab − PageTables − Unevictable``
(clamped at 0): ~1 GiB idle, 77–90 GiB with a model loaded (supervisor-anchors.md §6.6).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["MemInfo", "MeminfoReader", "parse_meminfo", "read_meminfo"]

KIB = 1024

# The fields the guard reads, as the kernel names them.
FIELDS: tuple[str, ...] = (
    "MemTotal", "MemFree", "MemAvailable", "Cached", "SwapTotal", "SwapFree", "Active", "Inactive",
    "Unevictable", "Shmem", "Slab", "PageTables", "Buffers",
)
OPTIONAL = ("SwapTotal", "SwapFree", "Buffers")  # read as 0 when absent (a kernel without swap support)


class MemInfo(NamedTuple):
    """The node's memory in bytes. ``driver_residual`` is derived (see the module docstring)."""

    mem_total: int
    mem_free: int
    mem_available: int
    cached: int  # page cache
    swap_total: int
    swap_free: int
    active: int
    inactive: int
    unevictable: int
    shmem: int
    slab: int
    page_tables: int
    buffers: int = 0

    @property
    def driver_residual(self) -> int:
        rest = (self.mem_total - self.mem_free - self.active - self.inactive - self.slab - self.page_tables
                - self.unevictable)
        return rest if rest > 0 else 0


class MeminfoError(ValueError):
    """The text lacks a field the guard needs (no MemAvailable: a kernel older than 3.14)."""


def parse_meminfo(text: str) -> MemInfo:
    """Parse `/proc/meminfo` text. Missing :data:`OPTIONAL` fields read as 0; any other missing field raises."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = KIB if len(parts) > 1 and parts[1] == "kB" else 1
            values[key.strip()] = int(parts[0]) * scale
    for name in OPTIONAL:
        values.setdefault(name, 0)
    missing = [f for f in FIELDS if f not in values]
    if missing:
        raise MeminfoError(f"meminfo lacks {', '.join(missing)}")
    return MemInfo(*(values[f] for f in FIELDS))


class MeminfoReader:
    """Reads `/proc/meminfo` (or ``path``) through one fd kept open. Not thread-safe; one per sampler."""

    BUFFER_BYTES = 16384  # /proc/meminfo is ~1.5 KiB; room for kernels that grow it

    def __init__(self, path: Path | str = "/proc/meminfo") -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        # Byte 0 is a newline so that every key, the first included, is found as b"\nKey:".
        self._buf = bytearray(self.BUFFER_BYTES)
        self._buf[0] = 0x0A
        self._view = memoryview(self._buf)[1:]
        self._keys: tuple[bytes, ...] = ()
        self._slots: tuple[int, ...] = ()  # index into FIELDS for each key in file order
        self._values = [0] * len(FIELDS)
        self._plan()

    def _plan(self) -> None:
        """Learn the order the kernel prints our keys in; checks the file once with the plain parser."""
        n = os.preadv(self._fd, [self._view], 0)
        data = bytes(self._buf[: 1 + n])
        parse_meminfo(data.decode("ascii", "replace"))  # raises if a field is missing
        keys = [b"\n" + f.encode() + b":" for f in FIELDS]
        found = sorted((data.find(key), i) for i, key in enumerate(keys))
        # Fields the file lacks (only the OPTIONAL ones may) stay 0.
        self._keys = tuple(keys[i] for pos, i in found if pos >= 0)
        self._slots = tuple(i for pos, i in found if pos >= 0)

    def read(self) -> MemInfo:
        """One sample. Raises :class:`MeminfoError` if the file stops looking like meminfo."""
        n = os.preadv(self._fd, [self._view], 0)
        buf, values = self._buf, self._values
        end = n + 1
        pos = 0
        for key, slot in zip(self._keys, self._slots, strict=True):
            start = buf.find(key, pos, end)
            if start < 0:
                raise MeminfoError(f"{self.path}: {key[1:-1].decode()} went missing")
            start += len(key)
            pos = buf.find(b"\n", start, end)
            if pos < 0:
                pos = end
            # int() skips the padding; the slice stops before " kB".
            values[slot] = int(buf[start : pos - 3]) * KIB
        return MemInfo._make(values)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> MeminfoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_meminfo(path: Path | str = "/proc/meminfo") -> MemInfo | None:
    """One plain reading (status, metrics without the guard, preflight); None when unreadable."""
    try:
        return parse_meminfo(Path(path).read_text(encoding="ascii", errors="replace"))
    except (OSError, MeminfoError):
        return None
