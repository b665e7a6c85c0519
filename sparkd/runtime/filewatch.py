"""A file's writes as an event (inotify), so the log follower waits for vLLM to write instead of polling.

Where inotify cannot be had (no such syscall, the watch limit reached, a path it cannot watch), ``FileWatch.open``
says None and the follower polls as before. A watch on ``/proc/<pid>/root/...`` sees a container's writes too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path

import anyio

from sparkd.host.waits import Flag

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE_SELF, IN_MOVE_SELF = 0x2, 0x4, 0x8, 0x400, 0x800
IN_DONT_FOLLOW = 0x02000000  # a symlink in the file's place is watched itself, never its target
_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class FileWatch:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> FileWatch | None:
        libc = _lib()
        if libc is None or not hasattr(libc, "inotify_init1"):
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(path), _MASK) < 0:
            os.close(fd)
            return None
        return cls(fd)

    async def wait(self, done: Flag, timeout_s: float) -> None:
        """Return once the file was written to (or truncated, moved, removed), ``done`` is set, or ``timeout_s``
        has passed; the events are consumed. One scope, no task (``sparkd.host.waits``)."""
        with done.interrupts(timeout_s):
            await anyio.wait_readable(self.fd)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        """Close the watch in a thread of its own: releasing an inotify instance waits for the kernel's RCU grace
        period (~8 ms here), and the follower closes it on the exit path, before the death is classified."""
        threading.Thread(target=_close_quietly, args=(self.fd,), name="inotify-close", daemon=True).start()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
