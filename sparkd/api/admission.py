"""Who may hold a connection to a listener, counted from the moment it is accepted (before any TLS). Pure
bookkeeping: the caller closes what :class:`Slots` refuses or evicts.

A flood of a third host's idle connections once took every slot of the TCP port and the head declared the
worker lost (security review §1); later, slots were counted only after the TLS handshake, so connections that
never sent a ClientHello were not counted at all and each held asyncio's 256 KiB buffer (review 2, #12); and
any local user on a peer's host took that peer's reserved slots, since trust was the source address alone
(review 2, #10). Now every accepted socket holds a :class:`Ticket` in one of three pools:

- ``general``: a source that is neither root on the control socket nor a configured peer's address. At most
  :attr:`Limits.per_source` per source and :attr:`Limits.general` for all of them together; more are refused.
- ``probation``: a connection from a configured peer's address that has not proved itself yet. At most
  :attr:`Limits.per_source` per address, in a room of its own: no flood from other hosts keeps the peer's new
  connection out. When that room is full, the oldest unproven connection of the address is evicted for the new
  one: the peer proves itself within a round trip or two, so whoever holds a connection without proving anything
  (any process on the peer's host may use its address) must keep opening connections faster than that.
- ``reserved``: a proven connection — a TLS client certificate chaining to ``tls_ca``, or a first request whose
  signature verifies (:meth:`Slots.promote`) — or root on the control socket (the kernel says so: SO_PEERCRED).
  :attr:`Limits.per_trusted` per source, outside the other pools.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class Limits:
    general: int = 48  # every connection from sources that are not trusted, together
    per_source: int = 8  # one source that is not trusted (and one peer address's unproven connections)
    per_trusted: int = 16  # one proven peer (or root), outside the general pool


class Pool(StrEnum):
    general = "general"
    probation = "probation"
    reserved = "reserved"


def admit(held: int, general_held: int, *, trusted: bool, limits: Limits) -> bool:
    """May one more connection come from a source that holds ``held`` (``general_held`` in the shared pool)?"""
    if trusted:
        return held < limits.per_trusted
    return held < limits.per_source and general_held < limits.general


@dataclass(eq=False)
class Ticket:
    """One accepted connection's place. ``close`` is set by whoever holds the connection at the moment (the
    accept loop before TLS, the HTTP protocol after): it is how an eviction ends it."""

    source: str
    pool: Pool
    close: Callable[[], None] | None = field(default=None, repr=False)
    left: bool = False


class Slots:
    """The connections held now, per pool and source; ``enter`` admits one, ``promote`` moves a proven one to the
    reserved room, ``leave`` returns its place (once)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held: Counter[tuple[Pool, str]] = Counter()
        self.general = 0
        self.unproven: dict[str, deque[Ticket]] = {}  # per peer address, oldest first
        self.refused = 0  # connections closed unanswered at once so far
        self.evicted = 0  # unproven connections of a peer's address closed for a newer one

    def enter(self, source: str, *, peer: bool, trusted: bool) -> tuple[Ticket | None, Ticket | None]:
        """(the new connection's ticket or None when it is refused, an older ticket the caller must close)."""
        if trusted:
            return self._take(source, Pool.reserved), None
        if not peer:
            return self._take(source, Pool.general), None
        waiting = self.unproven.setdefault(source, deque())
        evicted = None
        if len(waiting) >= self.limits.per_source:
            evicted = waiting.popleft()
            self._drop(evicted)
            self.evicted += 1
        ticket = Ticket(source, Pool.probation)
        waiting.append(ticket)
        self.held[(Pool.probation, source)] += 1
        return ticket, evicted

    def _take(self, source: str, pool: Pool) -> Ticket | None:
        trusted = pool is Pool.reserved
        if not admit(self.held[(pool, source)], self.general, trusted=trusted, limits=self.limits):
            self.refused += 1
            return None
        self.held[(pool, source)] += 1
        if pool is Pool.general:
            self.general += 1
        return Ticket(source, pool)

    def promote(self, ticket: Ticket) -> bool:
        """Move a proven connection from probation to the reserved room; False when that room is full (it stays
        where it is) or it is not on probation."""
        if ticket.left or ticket.pool is not Pool.probation:
            return ticket.pool is Pool.reserved and not ticket.left
        if self.held[(Pool.reserved, ticket.source)] >= self.limits.per_trusted:
            return False
        self._drop(ticket)
        self._forget(ticket)
        ticket.left, ticket.pool = False, Pool.reserved
        self.held[(Pool.reserved, ticket.source)] += 1
        return True

    def leave(self, ticket: Ticket) -> None:
        if ticket.left:
            return
        self._drop(ticket)
        self._forget(ticket)

    def _drop(self, ticket: Ticket) -> None:
        """Give the ticket's place back (it stays in the unproven queue: :meth:`_forget` removes it)."""
        ticket.left = True
        key = (ticket.pool, ticket.source)
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]
        if ticket.pool is Pool.general:
            self.general -= 1

    def _forget(self, ticket: Ticket) -> None:
        waiting = self.unproven.get(ticket.source)
        if waiting is not None and ticket.pool is Pool.probation:
            with contextlib.suppress(ValueError):
                waiting.remove(ticket)
            if not waiting:
                del self.unproven[ticket.source]

    def holding(self) -> int:
        return sum(self.held.values())
