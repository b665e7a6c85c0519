"""Which source addresses are this node's peers: ``[cluster] peers`` resolved to IP addresses.

The TCP listener keeps room for them and serves ``/v1/*`` to them only (security review §1, §2). An entry is
``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address; a host name is resolved (all its addresses)
when sparkd starts and again every :data:`REFRESH_S`, off the event loop. A name that does not resolve counts
for nothing until it does (and is logged). Addresses are compared in one form: an IPv4-mapped IPv6 address
(``::ffff:10.0.0.2``, what a dual-stack listener sees) is its IPv4 address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable

from sparkd.host.netaddr import normalise

__all__ = ["REFRESH_S", "PeerAddresses", "Resolver", "normalise", "peer_host", "system_resolver"]

REFRESH_S = 300.0

Resolver = Callable[[str], list[str]]


def peer_host(peer: str) -> str:
    """The host part of a ``[cluster] peers`` entry."""
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    if peer.count(":") == 1:
        return peer.split(":")[0]
    return peer


def system_resolver(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class PeerAddresses:
    """The peers' addresses: ``peer_of(address)`` names the configured peer a connection comes from."""

    def __init__(self, peers: Iterable[str], resolver: Resolver = system_resolver) -> None:
        self.peers = list(peers)
        self.resolver = resolver
        self._by_address: dict[str, str] = {}
        self.unresolved: list[str] = []
        self.refresh()

    def refresh(self) -> list[str]:
        """Resolve every entry again (blocking: call it off the loop); the entries that did not resolve."""
        found: dict[str, str] = {}
        unresolved: list[str] = []
        for peer in self.peers:
            host = peer_host(peer)
            try:
                ipaddress.ip_address(host.split("%")[0])
                addresses = [host]
            except ValueError:
                try:
                    addresses = self.resolver(host)
                except OSError:
                    addresses = []
            if not addresses:
                unresolved.append(peer)
            for address in addresses:
                found.setdefault(normalise(address), peer)
        self._by_address, self.unresolved = found, unresolved
        return unresolved

    def peer_of(self, address: str) -> str | None:
        return self._by_address.get(normalise(address))

    def __contains__(self, address: object) -> bool:
        return isinstance(address, str) and self.peer_of(address) is not None

    @property
    def addresses(self) -> frozenset[str]:
        return frozenset(self._by_address)
