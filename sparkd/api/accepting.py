"""The listening socket's own accept loop: a connection is admitted (:mod:`sparkd.api.admission`) the moment it is
accepted, before any TLS, and only then handed to asyncio as a transport.

asyncio's server wraps every accepted socket in TLS at once: an ``SSLProtocol`` with a 256 KiB buffer, waiting
60 s for a ClientHello, before sparkd could count it. 1000 silent connections from one address took a worker from
62 MB to 367 MB, and the memory stayed (security review 2, #12). Here a connection the slots refuse is closed
unread; an admitted one waits for its first bytes with nothing but its socket and a timer, and must finish its
TLS handshake within :data:`HANDSHAKE_S` of being accepted (a silent one is closed then).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from sparkd.api.admission import Slots, Ticket
from sparkd.host.heap import trim_heap

HANDSHAKE_S = 2.0  # from accept() to a finished TLS handshake
TRIM_AFTER_S = 1.0  # after the last failed handshake of a burst
OUT_OF_FDS_PAUSE_S = 1.0  # as asyncio's own server: accept() again after this when the process has no fd left
_OUT_OF_RESOURCE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

Identify = Callable[[socket.socket], Any]
Hand = Callable[[Any, Ticket], asyncio.Protocol]  # (the caller, its ticket) -> the protocol that serves it


class Doorway:
    """Accepts on ``sock`` forever: each connection is identified (``identify``), admitted or closed, and the
    admitted ones become transports whose protocol ``protocol_for`` makes."""

    def __init__(self, sock: socket.socket, slots: Slots, identify: Identify, protocol_for: Hand, *,
                 ssl_context: ssl.SSLContext | None = None, handshake_s: float = HANDSHAKE_S,
                 on_resource_error: Callable[[OSError], None] | None = None) -> None:
        self.sock = sock
        self.slots = slots
        self.identify = identify
        self.protocol_for = protocol_for
        self.ssl_context = ssl_context
        self.handshake_s = handshake_s
        self.on_resource_error = on_resource_error
        self.opening: set[asyncio.Task[bool]] = set()
        self._trim: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(self.sock)
                except OSError as exc:
                    if exc.errno in _OUT_OF_RESOURCE:
                        if self.on_resource_error is not None:
                            self.on_resource_error(exc)
                        await asyncio.sleep(OUT_OF_FDS_PAUSE_S)
                    continue  # ECONNABORTED and the like: that one connection is gone
                self.admit(conn)
                # sock_accept returns without yielding while the kernel's queue holds a connection: a flood that
                # keeps it full would keep every other task (the peers' requests among them) from running.
                await asyncio.sleep(0)
        finally:
            for task in list(self.opening):
                task.cancel()

    def admit(self, conn: socket.socket) -> None:
        try:
            caller = self.identify(conn)
        except OSError:
            conn.close()
            return
        ticket, evicted = self.slots.enter(caller.source, peer=caller.peer is not None, trusted=caller.trusted)
        if evicted is not None and evicted.close is not None:
            evicted.close()
        if ticket is None:
            _close_now(conn)
            return
        task = asyncio.get_running_loop().create_task(self._open(conn, caller, ticket))
        self.opening.add(task)
        # Closed here, not in _open: a task cancelled before its first step never runs its body (an eviction
        # right after the accept), and its socket would stay open, uncounted.
        task.add_done_callback(partial(self._opened, conn, ticket))
        if not task.done():
            ticket.close = partial(_cancel, task)

    async def _open(self, conn: socket.socket, caller: Any, ticket: Ticket) -> bool:
        """Whether the connection was handed to its protocol (else :meth:`_opened` closes it)."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        try:
            if self.ssl_context is not None:
                await asyncio.wait_for(_readable(loop, conn), self.handshake_s)
                if not conn.recv(1, socket.MSG_PEEK):
                    return False  # closed before a word: no TLS state for it
                left = max(self.handshake_s - (time.monotonic() - began), 0.05)
                await loop.connect_accepted_socket(lambda: self.protocol_for(caller, ticket), conn,
                                                   ssl=self.ssl_context, ssl_handshake_timeout=left)
            else:
                await loop.connect_accepted_socket(lambda: self.protocol_for(caller, ticket), conn)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            return False  # a failed or silent handshake: nothing was served
        return True

    def _opened(self, conn: socket.socket, ticket: Ticket, task: asyncio.Task[bool]) -> None:
        self.opening.discard(task)
        if not task.cancelled() and task.exception() is None and task.result():
            return
        self.slots.leave(ticket)
        with contextlib.suppress(OSError):
            conn.close()
        if self.ssl_context is not None:
            self._trim_later()

    def _trim_later(self) -> None:
        """Once a burst of failed handshakes is over, give what their TLS state took back to the system."""
        if self._trim is not None:
            self._trim.cancel()
        self._trim = asyncio.get_running_loop().call_later(TRIM_AFTER_S, trim_heap)


def _cancel(task: asyncio.Task[bool]) -> None:
    task.cancel()


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """Until ``conn`` has bytes to read (or its peer closed): a silent connection costs no TLS state meanwhile."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _close_now(conn: socket.socket) -> None:
    """Close a refused connection at once: a reset, no FIN_WAIT/TIME_WAIT state kept for it."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
