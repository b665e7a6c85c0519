"""The kernel log (`/dev/kmsg`): the driver's out-of-memory errors and OOM kills of vLLM.

On GB10, NVRM logs ``NV_ERR_NO_MEMORY`` when the unified pool runs dry even while MemAvailable still looks
healthy (a handful during startup are benign; the fatal pattern is the same line with MemAvailable under
~10 GiB). The kernel OOM killer logs ``Out of memory: Killed process <pid> (<comm>)``; process titles are
cut to 15 characters (``VLLM::EngineCor``, ``VLLM::Worker_TP``). The driver's ``NVRM: Xid (PCI:…): N, …``
lines and the PCIe ``AER: … Uncorrected (Fatal)`` lines are kept too: the failure classifier reads them
(:meth:`KernelLog.since`, passed as ``ClassifyContext.kernel_lines``).

:class:`KernelLog` opens `/dev/kmsg` non-blocking and seeks to the end, so only lines written after the
guard started count; each ``read`` returns one record and EAGAIN means "nothing new". When `/dev/kmsg` is
unreadable (no CAP_SYSLOG, a container) the guard goes on without it. Parsing is pure: :func:`parse_records`
and :func:`classify_line`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path

__all__ = ["KernelEvent", "KernelLog", "classify_line", "parse_records"]

NVRM_NO_MEMORY = "NV_ERR_NO_MEMORY"
_OOM_KILL = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)", re.IGNORECASE)
_XID = re.compile(r"NVRM: Xid \(|NVRM: .*fallen off the bus")
_AER = re.compile(r"AER: .*(?:Uncorrect\w* \((?:Fatal|Non-Fatal)\))")
_VLLM_COMM = re.compile(r"vllm", re.IGNORECASE)


class KernelEvent(StrEnum):
    nvrm_no_memory = "nvrm_no_memory"
    vllm_oom_kill = "vllm_oom_kill"  # the kernel OOM killer killed a vLLM process
    other_oom_kill = "other_oom_kill"
    xid = "xid"  # the NVIDIA driver reported a GPU error (an Xid, or the GPU fell off the bus)
    aer = "aer"  # the PCIe link reported an uncorrectable error


def parse_records(chunk: bytes) -> list[str]:
    """The messages in what one read returned. `/dev/kmsg` returns one record per read
    (``prio,seq,usec,flags;message`` then continuation lines that start with a space); a plain file in tests
    returns many, one per line."""
    messages = []
    for line in chunk.split(b"\n"):
        if not line or line.startswith(b" "):
            continue
        _, sep, message = line.partition(b";")
        messages.append((message if sep else line).decode("utf-8", "replace"))
    return messages


def classify_line(message: str, vllm_pids: Collection[int] = ()) -> KernelEvent | None:
    """What a kernel log message means to the guard, or None."""
    if NVRM_NO_MEMORY in message:
        return KernelEvent.nvrm_no_memory
    if _XID.search(message):
        return KernelEvent.xid
    if _AER.search(message):
        return KernelEvent.aer
    m = _OOM_KILL.search(message)
    if m is None:
        return None
    if int(m.group("pid")) in vllm_pids or _VLLM_COMM.search(m.group("comm")):
        return KernelEvent.vllm_oom_kill
    return KernelEvent.other_oom_kill


class KernelLog:
    """Counts kernel events from `/dev/kmsg` (or ``path``). :meth:`open` returns None when unreadable."""

    RECORD_BYTES = 8192  # the kernel's limit for one record is below this
    MAX_PER_DRAIN = 512  # records per drain, so a log storm cannot stall the sampler

    def __init__(self, fd: int, path: Path, *, keep_lines: int = 200) -> None:
        self._fd = fd
        self.path = path
        self._buf = bytearray(self.RECORD_BYTES)
        self._view = memoryview(self._buf)
        self.nvrm_errors = 0
        self.vllm_oom_kills = 0
        self.other_oom_kills = 0
        self.lines: deque[str] = deque(maxlen=keep_lines)  # recent lines, for incident evidence
        self.kept = 0  # lines kept so far; a mark for `since`
        self._events: deque[tuple[int, KernelEvent, str]] = deque(maxlen=keep_lines)

    @classmethod
    def open(cls, path: Path | str = "/dev/kmsg", *, from_start: bool = False) -> KernelLog | None:
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        if not from_start:
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_END)
        return cls(fd, path)

    def drain(self, vllm_pids: Collection[int] = ()) -> int:
        """Read what is new; returns the number of records read."""
        read = 0
        while read < self.MAX_PER_DRAIN:
            try:
                n = os.readv(self._fd, [self._view])
            except BlockingIOError:
                break
            except BrokenPipeError:  # records were overwritten before we read them; go on with the next
                continue
            except OSError:
                break
            if n == 0:  # end of a plain file
                break
            read += 1
            for message in parse_records(bytes(self._view[:n])):
                self._count(message, vllm_pids)
        return read

    def _count(self, message: str, vllm_pids: Collection[int]) -> None:
        event = classify_line(message, vllm_pids)
        if event is None:
            return
        self.lines.append(message)
        self.kept += 1
        self._events.append((self.kept, event, message))
        if event is KernelEvent.nvrm_no_memory:
            self.nvrm_errors += 1
        elif event is KernelEvent.vllm_oom_kill:
            self.vllm_oom_kills += 1
        elif event is KernelEvent.other_oom_kill:
            self.other_oom_kills += 1

    def since(self, mark: int) -> tuple[str, ...]:
        """The lines kept after `mark` (a value of :attr:`kept`) that can explain a vLLM failure: NVRM, Xid,
        AER and OOM kills of vLLM's processes (another process's OOM kill is left out)."""
        return tuple(message for seq, event, message in self._events
                     if seq > mark and event is not KernelEvent.other_oom_kill)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
