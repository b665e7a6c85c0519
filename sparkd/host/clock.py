"""Time for the shell: monotonic seconds for decisions, wall seconds for records, and sleeping.

Injected everywhere the shell reads time, so the real loop runs under :class:`sparkd.testing.FakeClock`.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: every decision uses these."""

    def wall(self) -> float:
        """Seconds since the epoch: for records and display only."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def wall_of(clock: Clock, mono: float | None) -> float | None:
    """The wall time of monotonic ``mono`` (for display): decisions never use the wall clock."""
    return None if mono is None else clock.wall() - clock.now() + mono
