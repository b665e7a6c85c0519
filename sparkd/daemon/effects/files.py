"""The daemon's small state files, written off the event loop.

Writes are coalesced (the newest data for a path wins) and run in a worker thread, so a slow disk never delays
the loop, the watchdog or the memory guard. The data may be a function that makes it: it is called once, on the
loop, when the write happens, so a burst of changes (a recovery is eight transitions in a few ms) renders the
status once. A write that fails (disk full, read-only, a directory in the way)
is never fatal: the problem is kept for status (sparkd reports itself degraded with the reason), logged once
per episode, and the write is tried again with the next change or after ``RETRY_S``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.state.files import write_json

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

RETRY_S = 5.0

_UNLINK = object()


class StateWriter:
    def __init__(self, log: Logger) -> None:
        self.log = log
        self._pending: dict[Path, Any] = {}
        self._wake = anyio.Event()
        self.problems: dict[Path, str] = {}

    def put(self, path: Path, data: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> None:
        self._pending[path] = data
        self._wake.set()

    def remove(self, path: Path) -> None:
        self._pending[path] = _UNLINK
        self._wake.set()

    def write_now(self, path: Path, data: Mapping[str, Any]) -> bool:
        """Write at once, in the loop (for the record of a launch, before anything else can happen)."""
        done = self._write(path, data)
        if done:
            self._pending.pop(path, None)
        else:
            self.put(path, data)
        return done

    async def run(self) -> None:
        while True:
            with anyio.move_on_after(RETRY_S if self.problems else None):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Write everything pending now (the daemon calls this before it exits)."""
        for path in list(self._pending):
            data = self._pending.get(path)
            if data is None:
                continue
            if data is _UNLINK:
                done = await anyio.to_thread.run_sync(self._unlink, path)
            else:
                made = data() if callable(data) else data
                done = await anyio.to_thread.run_sync(self._write, path, made)
            if done and self._pending.get(path) is data:  # a newer put waits for the next pass
                del self._pending[path]

    def _write(self, path: Path, data: Mapping[str, Any]) -> bool:
        try:
            write_json(path, data)
        except (OSError, ValueError) as exc:
            self._failed(path, exc)
            return False
        self._recovered(path)
        return True

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            self._failed(path, exc)
            return False
        self._recovered(path)
        return True

    def _failed(self, path: Path, exc: BaseException) -> None:
        problem = f"cannot write {path}: {exc}"
        if path not in self.problems:
            self.log.error("state_write_failed", path=str(path), error=str(exc))
        self.problems[path] = problem
        with contextlib.suppress(OSError):
            for tmp in path.parent.glob(f".{path.name}.*.tmp"):
                tmp.unlink()

    def _recovered(self, path: Path) -> None:
        if self.problems.pop(path, None) is not None:
            self.log.info("state_write_recovered", path=str(path))
