"""Times as sparkctl and sparkd print them: ISO 8601 with the zone's offset, local time by default
(``2026-11-27T05:36:36+00:00``), so a line read on another machine or in a ticket says which moment it was."""

from __future__ import annotations

from datetime import datetime


def iso(ts: float | None) -> str:
    """``ts`` (epoch seconds) as local ISO 8601 with its offset, to the second; ``?`` for none."""
    if not ts:
        return "?"
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
