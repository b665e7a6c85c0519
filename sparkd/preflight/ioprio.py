"""Low I/O priority for the thread that hashes the weights: ``ioprio_set(2)`` through ``syscall(2)`` (Python has
no wrapper), the idle class, so vLLM loading its shards or the page cache being refilled always go first.

Per thread (``who = 0`` is the calling thread): the hashing thread takes the idle class and gives it back when
done, so a worker thread anyio reuses later runs at its old priority. Where the syscall is unknown (another
architecture) or refused, hashing runs at normal priority and the caller says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator

IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13
IOPRIO_CLASS_IDLE = 3
# (ioprio_set, ioprio_get) by machine: asm-generic numbers on arm64, the x86-64 table otherwise.
SYSCALLS = {"x86_64": (251, 252), "aarch64": (30, 31), "arm64": (30, 31)}
IDLE = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT


def _syscall(number: int, *args: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(number, *(ctypes.c_int(a) for a in args)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def get() -> int | None:
    """This thread's I/O priority (class << 13 | data), or None where it cannot be read."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    try:
        return _syscall(numbers[1], IOPRIO_WHO_PROCESS, 0)
    except OSError:
        return None


def set_priority(value: int) -> bool:
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return False
    try:
        _syscall(numbers[0], IOPRIO_WHO_PROCESS, 0, value)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def idle_io() -> Iterator[bool]:
    """Run the block at the idle I/O class in this thread; yields whether it was set."""
    before = get()
    done = before is not None and set_priority(IDLE)
    try:
        yield done
    finally:
        if done and before is not None:
            set_priority(before)
