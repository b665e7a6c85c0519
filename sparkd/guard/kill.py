"""Signal the vLLM tree through pidfds, and hand its memory back at once.

A PID alone is not an identity: between listing the tree and signalling it, a PID can be reused. earlyoom's
answer is to open a pidfd first and signal through it; the guard does the same, and opens the pidfds before
it writes the evidence, so the slow part cannot widen the race. After SIGKILL, ``process_mrelease(2)``
(Linux 5.15) reaps the victim's address space right away instead of when its last thread has unwound;
on a unified-memory box those are the seconds in which the host freezes. Where it is missing the kill
still happens.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal
from collections.abc import Iterable

from sparkd.runtime.proctree import ancestors

__all__ = ["Victims", "process_mrelease"]

# process_mrelease is 448 in the generic syscall table (aarch64) and on x86_64.
_SYS_PROCESS_MRELEASE = {"x86_64": 448, "aarch64": 448}.get(platform.machine())
_libc: ctypes.CDLL | None = None


def process_mrelease(pidfd: int) -> bool:
    """Reap a dying process's memory now. False where the kernel or the platform cannot."""
    global _libc
    if _SYS_PROCESS_MRELEASE is None:
        return False
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return int(_libc.syscall(_SYS_PROCESS_MRELEASE, pidfd, 0)) == 0


class Victims:
    """The processes to signal, pinned by pidfd. PIDs that are already gone are skipped."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.fds: dict[int, int] = {}
        spared = ancestors()
        for pid in sorted(set(pids)):
            if pid in spared or pid <= 1:
                continue  # never init, never sparkd itself or its ancestors
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except OSError:
                continue

    @property
    def pids(self) -> list[int]:
        return list(self.fds)

    def signal(self, sig: int) -> list[int]:
        """Send ``sig`` to every victim; returns the PIDs it reached."""
        reached = []
        for pid, fd in self.fds.items():
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                continue
            reached.append(pid)
        return reached

    def release_memory(self) -> int:
        """After SIGKILL: reap each victim's memory now. Returns how many the kernel reaped."""
        return sum(1 for fd in self.fds.values() if process_mrelease(fd))

    def kill(self) -> list[int]:
        """SIGKILL every victim and reap its memory; returns the PIDs signalled."""
        reached = self.signal(signal.SIGKILL)
        self.release_memory()
        return reached

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def __enter__(self) -> Victims:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
