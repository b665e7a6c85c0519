"""uvicorn's HTTP/1.1 protocol with the limits a daemon on an open port needs.

uvicorn closes a connection that idles after a response (``timeout_keep_alive``) but waits forever for the first
request, and accepts any number of connections: 1,100 idle ones exhaust a daemon's 1024 descriptors. Here a
connection beyond ``MAX_CONNECTIONS`` is closed at once, and one that has not sent a whole request within
``HEADER_TIMEOUT_S`` (of its opening, or of its previous response) is closed (slowloris). The server's backlog
is ``MAX_CONNECTIONS`` too: asyncio accepts up to a backlog's worth per wakeup before any close runs.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 10.0
ACCEPT_ERROR_EVERY_S = 60.0  # asyncio logs every failed accept(); let one through per minute


class BoundedH11(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        watched = self.cycle
        self.loop.call_later(HEADER_TIMEOUT_S, self._expire, watched)

    def _expire(self, watched: Any) -> None:
        idle = self.cycle is watched and (watched is None or watched.response_complete)
        if idle and not self.transport.is_closing():
            self.transport.close()


class _OncePerEpisode(logging.Filter):
    """Lets one "out of system resource" accept error through per ACCEPT_ERROR_EVERY_S."""

    def __init__(self) -> None:
        super().__init__()
        self._last = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        if "socket.accept() out of system resource" not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self._last < ACCEPT_ERROR_EVERY_S:
            return False
        self._last = now
        return True


def harden_process() -> None:
    """Raise the descriptor soft limit to the hard limit, and quiet asyncio's per-attempt accept errors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logging.getLogger("asyncio").addFilter(_OncePerEpisode())
