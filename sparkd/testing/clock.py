"""Time for running sparkd's real daemon loop in-process: :class:`FakeClock`, monotonic and wall time that move only
when told, or jump to the next sleeper once every task is blocked (:meth:`FakeClock.run_until`), so a 300 s backoff
passes in microseconds. "Every task is blocked" is the event loop's own word, as trio's autojump clock hears it from
trio's run loop: the loop of :func:`new_event_loop` says so when it would wait for I/O or a timer with nothing ready
to run; a worker thread of anyio's still running holds the clock (its work takes real time)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
import time
from collections.abc import Callable
from typing import Any

import anyio

IDLE_LIMIT_S = 30.0  # real seconds run_until waits with nothing asleep on the fake clock (a worker thread's file
# write takes milliseconds)
THREAD_WAIT_S = 2.0  # real seconds run_until holds the fake clock for a worker thread before it moves time anyway
# (a thread that waits for the fake clock itself must not stop it)

_in_threads = 0  # anyio worker threads running now (the daemon's file writes, its golden, its hashing)
_real_run_sync = anyio.to_thread.run_sync


async def _counted_run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    global _in_threads
    _in_threads += 1
    try:
        return await _real_run_sync(func, *args, **kwargs)
    finally:
        _in_threads -= 1


def _count_threads() -> None:
    """A task waiting for a worker thread is blocked in the event loop's eyes, yet the thread's work takes real
    time: counted, ``run_until`` holds the fake clock while one runs, so that a loaded machine's slow thread does
    not see fake hours pass (a gate's budget spent while its golden was being written)."""
    anyio.to_thread.run_sync = _counted_run_sync  # type: ignore[assignment]

class FakeClock:
    def __init__(self, start: float = 1000.0, wall_offset: float = 1_800_000_000.0) -> None:
        self.t = start
        self.wall_offset = wall_offset
        _count_threads()
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + self.wall_offset

    async def sleep(self, seconds: float) -> None:
        wake = anyio.Event()
        heapq.heappush(self._sleepers, (self.t + max(0.0, seconds), next(self._order), wake))
        await wake.wait()

    def advance(self, seconds: float) -> None:
        """Move time on and wake every sleeper whose time has come."""
        self.t += seconds
        while self._sleepers and self._sleepers[0][0] <= self.t:
            heapq.heappop(self._sleepers)[2].set()

    async def run_until(self, done: Callable[[], bool], *, limit_s: float = 86_400.0) -> float:
        """Let every task run; whenever all are blocked and ``done()`` is false, jump to the next sleeper.
        Returns the fake seconds that passed. Raises TimeoutError past ``limit_s`` of fake time, or when nothing
        sleeps on the clock for ``IDLE_LIMIT_S`` real seconds (nothing left that could make ``done()`` true)."""
        started = self.t
        idle_since: float | None = None
        threads_since: float | None = None
        while True:
            await all_tasks_blocked()
            if done():
                return self.t - started
            if _in_threads:
                threads_since = time.monotonic() if threads_since is None else threads_since
                if time.monotonic() - threads_since < THREAD_WAIT_S:
                    await anyio.sleep(0.001)
                    continue
            threads_since = None
            if not self._sleepers:
                idle_since = time.monotonic() if idle_since is None else idle_since
                if time.monotonic() - idle_since > IDLE_LIMIT_S:
                    raise TimeoutError(f"not done, and nothing has slept on the fake clock for {IDLE_LIMIT_S:.0f} s")
                await anyio.sleep(0.001)  # a worker thread (a file write) may still be busy
                continue
            idle_since = None
            if self._sleepers[0][0] - started > limit_s:
                raise TimeoutError(f"not done after {limit_s:.0f} fake seconds")
            self.advance(max(0.0, self._sleepers[0][0] - self.t))


class _IdleSelector(selectors.DefaultSelector):
    """The loop's selector, which also tells who asked when the loop is idle: asked to wait (for I/O, a timer or
    for ever) while nothing is ready, because every task awaits something that has not happened yet."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[asyncio.Future[None]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not self.waiting or timeout == 0:  # work is ready: the loop runs it before it waits
            return super().select(timeout)
        ready = super().select(0)
        if ready:  # I/O came in (a socket, a worker thread's result): not idle yet
            return ready
        waiting, self.waiting = self.waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)  # its task is ready now: the loop runs it next, without waiting
        return []


class _IdleLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.idle = _IdleSelector()
        super().__init__(self.idle)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop that says when every task is blocked (:func:`all_tasks_blocked`); otherwise the stock
    selector loop."""
    return _IdleLoop()


async def all_tasks_blocked() -> None:
    """Return once every other task waits on something: the loop of :func:`new_event_loop` had nothing ready."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, _IdleLoop):
        raise RuntimeError("all_tasks_blocked needs the loop of sparkd.testing.new_event_loop: run the test with "
                           "anyio_backend = ('asyncio', {'loop_factory': sparkd.testing.new_event_loop})")
    future: asyncio.Future[None] = loop.create_future()
    loop.idle.waiting.append(future)
    await future
