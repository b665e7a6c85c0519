"""Who may hold a connection to a listener: a cap per source and on all sources together, with room that only
the trusted sources (the peers on the TCP port, root on the control socket) may use. Pure bookkeeping.

A flood of a third host's idle connections once took every slot of the TCP port and the head declared the
worker lost (security review §1). Now the sources that are not trusted share :attr:`Limits.general` slots, at
most :attr:`Limits.per_source` each, and each trusted source has :attr:`Limits.per_trusted` slots of its own,
outside that pool: no number of connections from elsewhere takes a peer's place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    general: int = 48  # every connection from sources that are not trusted, together
    per_source: int = 8  # one source that is not trusted
    per_trusted: int = 16  # one trusted source (a peer's daemon, root), outside the general pool


def admit(held: int, general_held: int, *, trusted: bool, limits: Limits) -> bool:
    """May one more connection come from a source that holds ``held`` (``general_held`` in the shared pool)?"""
    if trusted:
        return held < limits.per_trusted
    return held < limits.per_source and general_held < limits.general


class Slots:
    """The connections held now, per source; ``take`` admits one or refuses it, ``give`` returns it."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held: Counter[str] = Counter()
        self.general = 0
        self.refused = 0  # connections closed unanswered so far

    def take(self, source: str, *, trusted: bool) -> bool:
        if not admit(self.held[source], self.general, trusted=trusted, limits=self.limits):
            self.refused += 1
            return False
        self.held[source] += 1
        if not trusted:
            self.general += 1
        return True

    def give(self, source: str, *, trusted: bool) -> None:
        self.held[source] -= 1
        if self.held[source] <= 0:
            del self.held[source]
        if not trusted:
            self.general -= 1
