"""Who is calling the control API and the limits a daemon on an open port needs (:mod:`sparkd.api.http11` keeps
them on each connection).

A server that closes a connection idling after a response but waits forever for the first request and for a body,
and accepts any number of connections, is easy to starve: 1,100 idle ones exhausted a daemon's 1024 descriptors;
100 idle ones from a third host took every slot and the pair fell apart (security review §1); 16 requests whose
body never came held a peer's slots for good (review 2, #10, #11). Here:

- each connection is identified when it is accepted (:class:`Caller`): on the TCP port its source address and the
  configured peer it belongs to, later whether it presented a certificate that chains to ``[api] tls_ca``; on the
  control socket the caller's uid (``SO_PEERCRED``). Each request carries it (``Request.caller``), and
  ``Request.prove``: the call that moves a connection that proved itself into its peer's reserved room;
- it is admitted or closed unanswered before any TLS (:mod:`sparkd.api.accepting`, :mod:`sparkd.api.admission`);
- under TLS, a connection from a peer's address that presented no certificate is closed, one that did is proven;
- a request must arrive whole — headers and body — within ``first_request_s`` of the connection's opening (2 s),
  and each later one on a kept-alive connection within ``next_request_s`` of the previous answer; else the
  connection is closed (slowloris, idle holders, a body that never comes). A request received whole may take as
  long as its command needs.
"""

from __future__ import annotations

import resource
import socket
import struct
import time
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from sparkd.api.accepting import HANDSHAKE_S
from sparkd.api.admission import Limits, Slots
from sparkd.cluster.addresses import PeerAddresses, normalise

FIRST_REQUEST_S = 2.0
NEXT_REQUEST_S = 10.0
MIN_FDS = 1024  # the daemon's caps keep it far below this (docs/design.md §10); the unit's soft limit
TLS_READ_BUFFER = 32 * 1024


@dataclass(frozen=True)
class Caller:
    source: str  # the TCP source address, or "uid:N" on the control socket
    trusted: bool  # root on the control socket: the kernel vouches for it, so it has reserved room from accept on
    uid: int | None = None  # the control socket's caller
    peer: str | None = None  # the [cluster] peers entry the TCP source address belongs to
    certificate: bool = False  # presented a TLS certificate that chains to [api] tls_ca
    local: str | None = None  # "address:port" the TCP connection arrived at: a signed request's recipient


def _endpoint(name: Any) -> str | None:
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{normalise(str(name[0]))}:{name[1]}"
    return None


def tcp_caller(peers: PeerAddresses | None) -> Callable[[socket.socket], Caller]:
    def identify(conn: socket.socket) -> Caller:
        name = conn.getpeername()
        source = normalise(str(name[0])) if isinstance(name, tuple) and name else "?"
        peer = peers.peer_of(source) if peers is not None else None
        return Caller(source, False, peer=peer, local=_endpoint(conn.getsockname()))
    return identify


def unix_caller(conn: socket.socket) -> Caller:
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, struct.error):
        return Caller("uid:?", False)
    return Caller(f"uid:{uid}", uid == 0, uid=uid)


class Listener:
    """One server's connection policy: how callers are identified, how many each may hold, and for how long a
    connection may take to say what it wants."""

    def __init__(self, identify: Callable[[socket.socket], Caller], limits: Limits | None = None, *,
                 first_request_s: float = FIRST_REQUEST_S, next_request_s: float = NEXT_REQUEST_S,
                 handshake_s: float = HANDSHAKE_S) -> None:
        self.identify = identify
        self.slots = Slots(limits or Limits())
        self.first_request_s = first_request_s
        self.next_request_s = next_request_s
        self.handshake_s = handshake_s
        self._date_at: int | None = None
        self._date: list[tuple[bytes, bytes]] = []

    def date(self) -> list[tuple[bytes, bytes]]:
        """The Date header of this second, made once a second at most (when a request needs it)."""
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = [(b"date", formatdate(now, usegmt=True).encode())]
        return self._date


def harden_process() -> None:
    """The descriptor soft limit at least :data:`MIN_FDS` (the caps bound what the daemon holds; the unit's hard
    limit is for a host-process vLLM, which raises its own soft limit); TLS read buffers of 32 KiB
    (:func:`smaller_tls_buffers`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MIN_FDS if hard == resource.RLIM_INFINITY else min(MIN_FDS, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    smaller_tls_buffers()


def smaller_tls_buffers() -> None:
    """asyncio gives each TLS connection it serves a read buffer of 256 KiB (``SSLProtocol.max_size``) from the
    first byte of its handshake; 48 handshakes held open by a client that never finishes them kept ~16 MB of the
    daemon's heap after they were gone (with 32 KiB: ~5 MB, once; tests/bench/bench_flood.py). 32 KiB still takes
    two whole TLS records (16 KiB each) per read. Only the listeners' connections use asyncio's TLS in this
    process (the peer client's TLS is anyio's)."""
    sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
