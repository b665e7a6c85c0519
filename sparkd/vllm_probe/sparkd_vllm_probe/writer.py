"""The writer of one step file (:mod:`.layout`): made whole under a temporary name and renamed into place, its pages
written before they are mapped (a full tmpfs then fails the write here, not a store into the mapping later), then
two stores of the step block per step, each one ``pack_into`` and one monotonic clock reading. Lock-free: one
writer per file, the block's sequence number tells a reader it raced a write.

Used by the plugin's vLLM hooks (:mod:`.hooks`) and by anything that steps like vLLM does: sparkd's stand-in and
the GPU host's NCCL ranks import it instead of copying the format.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import sys
import time

from . import layout

_BEGIN_PACK = layout.BEGIN.pack_into
_BEGIN_AT = layout.BEGIN_AT
_END_PACK = layout.END.pack_into
_END_AT = layout.END_AT
_mono = time.monotonic_ns


def _start_ticks() -> int:
    """This process's start time in clock ticks after boot (field 22 of /proc/self/stat); 0 where unknown."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _pid_ns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class StepWriter:
    """One process's step file. ``begin``/``end`` (and ``collective``) are the per-step calls; ``off`` records why
    the writer stops, ``close`` unmaps it (the file stays: its last record is the evidence)."""

    __slots__ = ("_map", "_mark", "began", "longest", "longest_tokens", "path", "step", "tokens")

    def __init__(self, directory: str, role: int, rank: int, *, local_rank: int = -1, world_size: int = 1,
                 title: str = "", vllm: str = "") -> None:
        if sys.byteorder != "little":
            raise OSError("the step file is little-endian; this machine is not")
        self.path = os.path.join(directory, layout.file_name(role, rank))
        self.step = self.began = self.longest = self.longest_tokens = self._mark = 0
        self.tokens = layout.UNKNOWN
        image = bytearray(layout.SIZE)
        layout.HEADER.pack_into(image, 0, layout.MAGIC, layout.VERSION)
        anchor_mono, anchor_wall = _mono(), time.time_ns()
        layout.IDENTITY.pack_into(image, layout.IDENTITY_AT, role, rank, local_rank, world_size, os.getpid(),
                                  _pid_ns(), _start_ticks(), anchor_mono, anchor_wall, 0, 0, 0)
        layout.END.pack_into(image, layout.END_AT, 0, 0, layout.UNKNOWN, 0, 0, 0)
        layout.BEGIN.pack_into(image, layout.BEGIN_AT, 0, 0, layout.UNKNOWN, 0)
        texts = (socket.gethostname(), _boot_id(), title, vllm)
        image[layout.TEXT_AT:layout.NOTE_AT] = b"".join(
            layout.text(texts[i], size) for i, (_, size) in enumerate(layout.TEXTS))
        self._map = self._create(image)

    def _create(self, image: bytearray) -> mmap.mmap:
        temp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, bytes(image))
            if written != layout.SIZE:
                raise OSError(f"wrote {written} of {layout.SIZE} bytes to {temp}")
            os.rename(temp, self.path)
            return mmap.mmap(fd, layout.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        finally:
            os.close(fd)

    def begin(self, tokens: int = layout.UNKNOWN) -> None:
        """A step begins (``tokens``: what the scheduler gave it)."""
        self.began = began = _mono()
        self.step = step = self.step + 1
        self.tokens = tokens
        _BEGIN_PACK(self._map, _BEGIN_AT, step, began, tokens, step)

    def end(self, held: int = layout.UNKNOWN) -> None:
        """The step ended (``held``: requests an engine still holds after it)."""
        now = _mono()
        if now - self.began > self.longest:
            self.longest, self.longest_tokens = now - self.began, self.tokens
        step = self.step
        _END_PACK(self._map, _END_AT, step, now, held, self.longest, self.longest_tokens, step)

    def _marked(self, kind: int) -> None:
        self._mark = mark = self._mark + 1
        layout.MARK.pack_into(self._map, layout.MARK_AT, mark, kind, self.step, mark)

    def collective(self) -> None:
        """Inside the current step, the process now waits in a collective (where the caller can see it)."""
        self._marked(layout.COLLECTIVE)

    def off(self, why: str) -> None:
        """The writer stops recording: the phase says off, the note says why. The step blocks are written whole
        again first: a store that failed half-way (a value that is no count) leaves a block torn."""
        tokens = self.tokens if isinstance(self.tokens, int) else layout.UNKNOWN
        step, began = int(self.step), int(self.began)
        layout.BEGIN.pack_into(self._map, layout.BEGIN_AT, step, began, tokens, step)
        layout.END.pack_into(self._map, layout.END_AT, step, began, layout.UNKNOWN, int(self.longest),
                             int(self.longest_tokens) if isinstance(self.longest_tokens, int) else layout.UNKNOWN,
                             step)
        self._map[layout.NOTE_AT:layout.SIZE] = layout.text(why, layout.NOTE_SIZE)
        self._marked(layout.OFF)

    def close(self) -> None:
        with contextlib.suppress(ValueError, BufferError):
            self._map.close()
