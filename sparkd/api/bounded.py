"""uvicorn's HTTP/1.1 protocol with the limits a daemon on an open port needs, and who is calling.

uvicorn closes a connection that idles after a response (``timeout_keep_alive``) but waits forever for the first
request, and accepts any number of connections: 1,100 idle ones exhausted a daemon's 1024 descriptors, and when a
cap of 64 replaced that, 100 idle ones from a third host took every slot and the pair fell apart (security
review §1). Here:

- each connection is identified when it is made (:class:`Caller`): on the TCP port its source address, the
  configured peer it belongs to, and whether it presented a certificate that chains to ``[api] tls_ca``; on the
  control socket the caller's uid (``SO_PEERCRED``). The request's ASGI scope carries it as ``sparkd.caller``;
- :class:`~sparkd.api.admission.Slots` admits it or closes it at once, unanswered: per source, with slots kept
  for the trusted sources (the peers; root on the control socket);
- a connection that has not sent a whole request within ``first_request_s`` of its opening (2 s), or within
  ``HEADER_TIMEOUT_S`` of its previous response, is closed (slowloris, idle holders).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import struct
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from sparkd.api.admission import Limits, Slots
from sparkd.cluster.addresses import PeerAddresses, normalise

FIRST_REQUEST_S = 2.0
HEADER_TIMEOUT_S = 10.0
ACCEPT_ERROR_EVERY_S = 60.0  # asyncio logs every failed accept(); let one through per minute
SCOPE_KEY = "sparkd.caller"


@dataclass(frozen=True)
class Caller:
    source: str  # the TCP source address, or "uid:N" on the control socket
    trusted: bool  # a configured peer's address (TCP), or root (the control socket)
    uid: int | None = None  # the control socket's caller
    peer: str | None = None  # the [cluster] peers entry the TCP source address belongs to
    certificate: bool = False  # presented a TLS certificate that chains to [api] tls_ca


def caller_of(scope: MutableMapping[str, Any]) -> Caller | None:
    caller = scope.get(SCOPE_KEY)
    return caller if isinstance(caller, Caller) else None


def tcp_caller(peers: PeerAddresses | None) -> Callable[[asyncio.Transport], Caller]:
    def identify(transport: asyncio.Transport) -> Caller:
        name = transport.get_extra_info("peername")
        source = normalise(str(name[0])) if isinstance(name, tuple) and name else "?"
        peer = peers.peer_of(source) if peers is not None else None
        return Caller(source, peer is not None, peer=peer,
                      certificate=bool(transport.get_extra_info("peercert")))
    return identify


def unix_caller(transport: asyncio.Transport) -> Caller:
    sock = transport.get_extra_info("socket")
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError, struct.error):
        return Caller("uid:?", False)
    return Caller(f"uid:{uid}", uid == 0, uid=uid)


class Listener:
    """One server's connection policy: how callers are identified and how many each may hold."""

    def __init__(self, identify: Callable[[asyncio.Transport], Caller], limits: Limits | None = None, *,
                 first_request_s: float = FIRST_REQUEST_S) -> None:
        self.identify = identify
        self.slots = Slots(limits or Limits())
        self.first_request_s = first_request_s

    def protocol(self) -> type[H11Protocol]:
        return type("ListenerH11", (BoundedH11,), {"listener": self})


class BoundedH11(H11Protocol):
    listener: Listener
    _caller: Caller | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        caller = self.listener.identify(transport)
        if not self.listener.slots.take(caller.source, trusted=caller.trusted):
            self.connections.discard(self)  # never counted: uvicorn's own cap would answer the peers 503
            transport.close()
            return
        self._caller = caller
        inner = self.app

        async def tagged(scope: Any, receive: Any, send: Any) -> None:
            scope[SCOPE_KEY] = caller
            await inner(scope, receive, send)

        self.app = tagged
        self._arm(self.listener.first_request_s)

    def connection_lost(self, exc: Exception | None) -> None:
        caller, self._caller = self._caller, None
        if caller is not None:
            self.listener.slots.give(caller.source, trusted=caller.trusted)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm(HEADER_TIMEOUT_S)

    def _arm(self, seconds: float) -> None:
        watched = self.cycle
        self.loop.call_later(seconds, self._expire, watched)

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
