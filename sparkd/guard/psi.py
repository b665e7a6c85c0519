"""Pressure stall information for memory (`/proc/pressure/memory`, Documentation/accounting/psi.rst).

``some`` is the share of time at least one task stalled on memory, ``full`` the share all non-idle tasks
did; ``avg10`` is that share over 10 s, in percent; ``total`` the stall time in microseconds.

:class:`PressureReader` reads the file through one fd kept open. :class:`PsiTrigger` registers a kernel
trigger (``"some 150000 1000000"``: 150 ms of stall within 1 s) so the sampler wakes the moment the kernel
sees a stall instead of at its next tick. The kernel reports a trigger as POLLPRI, which event loops do not
wait for, so the trigger fd sits in a private edge-triggered epoll whose own fd becomes readable: the
sampler waits for that (``sparkd.host.waits.readable_within``). Registering needs CAP_SYS_RESOURCE for windows that
are not a multiple of 2 s; without it the window is rounded up, and where triggers are not permitted at
all the guard polls on.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
from pathlib import Path
from typing import NamedTuple

from sparkd.host.waits import readable_within

__all__ = ["Pressure", "PressureReader", "PsiTrigger", "parse_pressure"]

UNPRIVILEGED_WINDOW_US = 2_000_000  # without CAP_SYS_RESOURCE the window must be a multiple of this


class Pressure(NamedTuple):
    some_avg10: float  # percent
    some_total_us: int
    full_avg10: float  # percent
    full_total_us: int


def _field(text: str, line: str, name: str) -> str:
    start = text.index(line)
    end = text.find("\n", start)
    segment = text[start : end if end >= 0 else len(text)]
    key = f" {name}="
    at = segment.index(key) + len(key)
    stop = segment.find(" ", at)
    return segment[at : stop if stop >= 0 else len(segment)]


def parse_pressure(text: str) -> Pressure:
    """Parse a pressure file. A file without a ``full`` line (cpu on old kernels) reads full as 0."""
    try:
        some = (float(_field(text, "some ", "avg10")), int(_field(text, "some ", "total")))
    except ValueError as exc:
        raise ValueError(f"not a PSI pressure file: {text[:80]!r}") from exc
    try:
        full = (float(_field(text, "full ", "avg10")), int(_field(text, "full ", "total")))
    except ValueError:
        full = (0.0, 0)
    return Pressure(some[0], some[1], full[0], full[1])


class PressureReader:
    """Reads the pressure file through one open fd into a preallocated buffer."""

    def __init__(self, path: Path | str = "/proc/pressure/memory") -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self._buf = bytearray(512)
        self._view = memoryview(self._buf)
        self.read()  # fail now, not in the loop, if it is not a pressure file

    def read(self) -> Pressure:
        n = os.preadv(self._fd, [self._view], 0)
        buf = self._buf
        some = buf.find(b"some avg10=", 0, n) + 11
        full = buf.find(b"full avg10=", 0, n) + 11
        if some < 11:
            raise ValueError(f"{self.path}: no 'some' line")
        some_total = buf.find(b"total=", some, n) + 6
        some_avg10 = float(buf[some : buf.find(b" ", some, n)])
        some_us = int(buf[some_total : buf.find(b"\n", some_total, n)])
        if full < 11:
            return Pressure(some_avg10, some_us, 0.0, 0)
        full_total = buf.find(b"total=", full, n) + 6
        end = buf.find(b"\n", full_total, n)
        return Pressure(some_avg10, some_us, float(buf[full : buf.find(b" ", full, n)]),
                        int(buf[full_total : end if end >= 0 else n]))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unprivileged(trigger: str) -> str | None:
    """The same trigger with its window rounded up to a multiple of 2 s (stall scaled alike)."""
    kind, stall, window = trigger.split()
    stall_us, window_us = int(stall), int(window)
    if window_us % UNPRIVILEGED_WINDOW_US == 0:
        return None
    rounded = math.ceil(window_us / UNPRIVILEGED_WINDOW_US) * UNPRIVILEGED_WINDOW_US
    return f"{kind} {stall_us * rounded // window_us} {rounded}"


class PsiTrigger:
    """A kernel PSI trigger the sampler can wait on. Build it with :meth:`register`."""

    def __init__(self, fd: int, spec: str, events: int = select.EPOLLPRI) -> None:
        self.fd = fd  # owned: closing it removes the trigger
        self.spec = spec
        self._epoll = select.epoll()
        self._epoll.register(fd, events | select.EPOLLERR | select.EPOLLET)
        self.fired = 0

    @classmethod
    def register(cls, path: Path | str, trigger: str) -> PsiTrigger | None:
        """Register ``trigger`` on ``path``; None where the kernel does not permit it (the guard polls on)."""
        for spec in (trigger, _unprivileged(trigger)):
            if spec is None:
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                os.write(fd, spec.encode() + b"\0")
                return cls(fd, spec)
            except OSError:  # EINVAL: window not permitted; EPERM: not a pollable pressure file
                os.close(fd)
        return None

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``; True when the trigger fired. Raises OSError when the source is gone. The
        guard's wait at every sample: a timeout here is no cancellation (``sparkd.host.waits``)."""
        if not await readable_within(self._epoll.fileno(), timeout_s):
            return False
        events = self._epoll.poll(0)
        if any(ev & select.EPOLLERR for _, ev in events):
            raise OSError(f"PSI trigger {self.spec!r}: the pressure source went away")
        self.fired += 1
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._epoll.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
