"""How many tasks a piece of async code starts: the loop's task factory counts them (a resting daemon's waits
promise to start none)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def tasks_started(body: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """(the tasks ``body`` started, what it returned)."""
    loop = asyncio.get_running_loop()
    started: list[object] = []
    loop.set_task_factory(lambda lp, coro, **kw: started.append(coro) or asyncio.Task(coro, loop=lp, **kw))
    try:
        result = await body()
    finally:
        loop.set_task_factory(None)
    return len(started), result
