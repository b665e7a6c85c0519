"""Waits a resting daemon makes many times a minute, each for about the cost of one wake-up.

anyio's general way to wait for "this or that" costs more than the waiting: a task group spawns a task per source
and cancels the loser from a task (anyio's cancel formats that task's repr into its reason), and a deadline that
passes is a cancellation delivered over several turns of the loop. At rest these were a large share of the
daemon's CPU (``tests/bench/README.md``). So:

- :class:`Flag`, a one-shot event that also ends the waits it interrupts: ``with flag.interrupts(timeout_s):``
  around one await waits for that await, the flag or the timeout in one cancel scope, no task spawned;
- :class:`Alarm`, a flag that sets itself a while after its last ``reset``: a deadline that work pushes back
  many times a minute costs one timer on the loop per push and no task awake (a task sleeping until the deadline
  woke at each push's old deadline only to sleep again);
- :func:`readable_within`, an fd's readiness or a timeout on one future with the loop's own reader and timer,
  no cancel scope (sparkd runs on anyio's asyncio backend; a scope around the caller cancels it as any wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

import anyio


class Flag:
    """Set once (``set``), waited on by any number of tasks (``wait``), and an interruption of other waits."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._scopes: set[anyio.CancelScope] = set()

    def set(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        for scope in list(self._scopes):
            scope.cancel()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    @contextlib.contextmanager
    def interrupts(self, timeout_s: float | None = None) -> Iterator[anyio.CancelScope]:
        """A scope that ends its body when the flag is set (already set: at the body's first await) or after
        ``timeout_s``; the body is cancelled, not failed, as with ``anyio.move_on_after``."""
        deadline = math.inf if timeout_s is None else anyio.current_time() + timeout_s
        with anyio.CancelScope(deadline=deadline) as scope:
            if self._event.is_set():
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)


class Alarm(Flag):
    """Set ``after_s`` seconds after it was made or last :meth:`reset` (loop time), unless :meth:`cancel` was
    called since. Make it inside the event loop."""

    def __init__(self, after_s: float) -> None:
        super().__init__()
        self.after_s = after_s
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        self.cancel()
        self._timer = self._loop.call_later(self.after_s, self.set)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def readable_within(fd: int, timeout_s: float) -> bool:
    """Wait until ``fd`` is readable (True) or ``timeout_s`` has passed (False)."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[bool] = loop.create_future()
    loop.add_reader(fd, _resolve, woken, True)
    timer = loop.call_later(timeout_s, _resolve, woken, False)
    try:
        return await woken
    finally:
        timer.cancel()
        loop.remove_reader(fd)


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
