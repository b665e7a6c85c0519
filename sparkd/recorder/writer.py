"""The recorder's writer: one thread that appends records to the ring and makes them durable at a bounded rate.

The daemon's loop packs a record and hands it over (:meth:`RingWriter.put`, a deque append and an event: no
I/O, nothing that can block the loop or the memory guard beside it). The thread writes each record with one
``pwrite`` into the page cache and calls ``fdatasync`` about once every ``sync_interval_s``: a record written
after a quiet spell is synced at once, a burst waits for the next slot. A record that comes up to
:data:`SYNC_EARLY` of the interval early is synced at once: records come once an interval, riding the memory
guard's samples, and a second wake-up of the thread only to wait out the last milliseconds costs more than the
sync. A disk that stalls holds the thread, never the loop: past :data:`BACKLOG` records waiting, new ones are
dropped and counted. A ring that cannot be opened or written is a problem for status (sparkd reports itself
degraded), retried, never fatal.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sparkd.recorder.record import Record
from sparkd.recorder.ring import RingFile

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

__all__ = ["BACKLOG", "RingWriter"]

BACKLOG = 256  # records waiting for the thread before new ones are dropped
REOPEN_S = 10.0
SYNC_EARLY = 0.1  # share of sync_interval_s


class RingWriter:
    def __init__(self, path: Path, size: int, *, sync_interval_s: float, log: Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.size = size
        self.sync_interval_s = sync_interval_s
        self.log = log
        self.clock = clock
        self.problem: str | None = None
        self.synced_at: float | None = None  # monotonic time of the last fdatasync that succeeded
        self.written = 0
        self.dropped = 0
        self.syncs = 0
        self.cpu_s = 0.0  # CPU time the thread spent writing and syncing (its own clock)
        self.found: list[Record] = []  # what the ring held when it was opened
        self.opened = threading.Event()
        self._ring: RingFile | None = None
        self._queue: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._last_sync = float("-inf")
        self._open_tried = float("-inf")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sparkd-recorder", daemon=True)
        self._wake.set()  # open the ring at once
        self._thread.start()

    def put(self, payload: bytes) -> bool:
        """Queue one record for the thread; False (and counted) when the disk is that far behind."""
        if len(self._queue) >= BACKLOG:
            self.dropped += 1
            return False
        self._queue.append(payload)
        self._wake.set()
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Write and sync what is queued, then close (a clean exit's last record reaches the disk)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ---- the thread
    def _run(self) -> None:
        while True:
            timeout = None
            if self._ring is not None and self._ring.dirty:
                timeout = max(0.0, self._sync_due() - self.clock())
            elif self._ring is None and not self._stopping:
                timeout = REOPEN_S
            self._wake.wait(timeout)
            self._wake.clear()
            started = time.thread_time()
            try:
                if self._step():
                    return
            finally:
                self.cpu_s += time.thread_time() - started

    def _step(self) -> bool:
        """Write what is queued, sync when due; True once the writer is done (closed)."""
        if self._ring is None and not self._ensure_open():
            self.dropped += len(self._queue)
            self._queue.clear()
            return self._stopping
        self._drain()
        if self._stopping or self.clock() >= self._sync_due():
            self._sync()
        if self._stopping and not self._queue:
            assert self._ring is not None
            self._ring.close()
            return True
        return False

    def _sync_due(self) -> float:
        return self._last_sync + self.sync_interval_s * (1 - SYNC_EARLY)

    def _ensure_open(self) -> bool:
        now = self.clock()
        if now - self._open_tried < REOPEN_S and not self._stopping:
            return False
        self._open_tried = now
        ring = RingFile(self.path, self.size)
        try:
            self.found = ring.open()
        except OSError as exc:
            self._failed(f"cannot open the flight recorder's ring {self.path}: {exc.strerror or exc}")
            return False
        self._ring = ring
        self.opened.set()
        self.log.info("recorder_opened", path=str(self.path), records=len(self.found), carried=ring.carried,
                      size=self.size)
        return True

    def _drain(self) -> None:
        assert self._ring is not None
        while self._queue:
            payload = self._queue.popleft()
            try:
                self._ring.append(payload)
            except OSError as exc:
                self.dropped += 1
                self._failed(f"cannot write the flight recorder's ring {self.path}: {exc.strerror or exc}")
                continue
            self.written += 1

    def _sync(self) -> None:
        assert self._ring is not None
        if not self._ring.dirty:
            return
        try:
            self._ring.sync()
        except OSError as exc:
            self._failed(f"cannot sync the flight recorder's ring {self.path}: {exc.strerror or exc}")
            return
        self._last_sync = self.synced_at = self.clock()
        self.syncs += 1
        if self.problem is not None:
            self.problem = None
            self.log.info("recorder_recovered", path=str(self.path))

    def _failed(self, problem: str) -> None:
        if self.problem is None:
            self.log.error("recorder_write_failed", problem=problem)
        self.problem = problem
