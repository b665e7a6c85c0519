"""The daemon's task group for the work its parts start beside the loop (an instance's watch, a stop's note into
its incident, the worker's report to its head, a manifest's hashing): built with the daemon, open while it runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus


class Tasks:
    def __init__(self) -> None:
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the task group open until cancelled (started: :meth:`spawn` may be called)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.Event().wait()  # no timer: a fake clock never jumps to it
        finally:
            self._tg = None

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None, "the daemon's parts act only while it runs"
        self._tg.start_soon(fn, *args)
