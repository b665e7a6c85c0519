"""How often a target is told, what is held back meanwhile, and when a target that does not answer is tried
again. Pure: every method takes the monotonic time it decides at.

- **Rate**: a token bucket per target, ``burst`` messages at once, refilled at ``per_hour``. A message that finds no
  token is held back: counted by kind (and failure class), the worst kept. When a token comes back, what was held
  back goes as one summary (severity: the worst held back), before anything newer.
- **Retry**: a delivery that fails is tried again after 2 s, 4 s, 8 s … up to ``retry_max_s`` between tries, for as
  long as it takes; the target's queue is bounded, so a dead target costs a fixed amount of memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sparkd.notify.events import Event, EventKind

__all__ = ["FIRST_RETRY_S", "HeldBack", "RateLimiter", "retry_delay"]

FIRST_RETRY_S = 2.0


def retry_delay(failures: int, max_s: float) -> float:
    """The wait before try ``failures + 1`` of a delivery that failed ``failures`` times (≥ 1) in a row."""
    return min(max_s, FIRST_RETRY_S * 2 ** min(max(failures - 1, 0), 30))


@dataclass
class RateLimiter:
    burst: int
    per_hour: int
    tokens: float = -1.0  # -1: full, set at the first use
    at: float | None = None

    def _refill(self, now: float) -> None:
        if self.at is None or self.tokens < 0:
            self.tokens, self.at = float(self.burst), now
            return
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_hour / 3600.0)
        self.at = now

    def take(self, now: float) -> bool:
        """Spend a token if there is one."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def next_at(self, now: float) -> float:
        """When the next token is there (``now`` when one is)."""
        self._refill(now)
        return now if self.tokens >= 1.0 else now + (1.0 - self.tokens) * 3600.0 / self.per_hour


@dataclass
class HeldBack:
    """What the rate limiter kept from one target since its last summary."""

    counts: Counter[str] = field(default_factory=Counter)  # by kind, or kind:class
    worst: Event | None = None
    since: float | None = None  # wall time of the first held back

    def __bool__(self) -> bool:
        return self.worst is not None

    def add(self, event: Event) -> None:
        self.counts[event.kind.value + (f" {event.failure_class}" if event.failure_class else "")] += 1
        if self.worst is None or event.severity.rank >= self.worst.severity.rank:
            self.worst = event
        if self.since is None:
            self.since = event.at

    def summary(self, node: str, per_hour: int) -> Event:
        """One event for all of it; the held-back state is cleared."""
        worst = self.worst
        assert worst is not None, "nothing was held back"
        total = sum(self.counts.values())
        parts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])))
        text = (f"{total} notification{'s' if total != 1 else ''} from {node} were held back by the rate limit "
                f"([notify] per_hour = {per_hour}): {parts}. The latest of the worst: {worst.title}: {worst.text}")
        event = Event(EventKind.held_back, worst.severity, node, f"{total} notifications from {node} held back",
                      text, worst.failure_class, worst.anchor, counts=dict(self.counts))
        self.counts, self.worst, self.since = Counter(), None, None
        return event
