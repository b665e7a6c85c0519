"""When the fingerprint is replayed while vLLM serves: at an interval, and only while the engine is idle, so that it
never competes with users (issue 37). Pure; the shell feeds it vLLM's gauges (``vllm:num_requests_running`` and
``_waiting``, as its metrics scrape reads them) and asks :func:`due` on its own cadence. After a wake (vLLM's line,
:func:`woke`) or a hand-over the shell replays at once, without asking.

Rules:

1. Idle since the first scrape that saw no request running and none waiting; any request ends the idle spell.
   A scrape that could not be read changes nothing.
2. Due when ``interval_s`` has passed since the last gate or replay, and the engine has been idle for ``idle_s``.
   ``interval_s`` 0: never.
3. A replay asks the fingerprint (and numerics, where on) — not the garble levels, which load the engine, and not
   speculative decoding, whose positions a few short answers need not all reach (:func:`replay_parts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sparkd.supervisor.acceptance.gate import Part

__all__ = ["WAKE_LINE", "Idle", "due", "observe_load", "ran", "replay_parts", "woke"]

# vLLM 0.32's API server as ``POST /wake_up`` begins (entrypoints/serve/dev/sleep/api_router.py): the wake follows
WAKE_LINE = "wake up the engine with tags"


@dataclass(frozen=True)
class Idle:
    last_run_at: float | None = None  # monotonic: the last gate or replay
    idle_since: float | None = None  # monotonic: since when no request ran nor waited


def observe_load(idle: Idle, running: float | None, waiting: float | None, now: float) -> Idle:
    """Fold one scrape's request gauges (None: not read)."""
    if running is None:
        return idle
    busy = running > 0 or (waiting or 0) > 0
    if busy:
        return replace(idle, idle_since=None) if idle.idle_since is not None else idle
    return idle if idle.idle_since is not None else replace(idle, idle_since=now)


def ran(idle: Idle, now: float) -> Idle:
    """A gate or a replay ran at ``now`` (its own requests are no user's: the idle spell goes on)."""
    return replace(idle, last_run_at=now)


def due(idle: Idle, now: float, *, interval_s: float, idle_s: float) -> str | None:
    """Why a replay is due now, or None."""
    if interval_s <= 0 or idle.idle_since is None:
        return None
    if idle.last_run_at is not None and now - idle.last_run_at < interval_s:
        return None
    if now - idle.idle_since < idle_s:
        return None
    since = "no gate ran yet" if idle.last_run_at is None else f"{now - idle.last_run_at:.0f} s since the last"
    return f"replay: {since}, the engine idle for {now - idle.idle_since:.0f} s"


def replay_parts(planned: Sequence[Part]) -> tuple[Part, ...]:
    """What a replay runs of the start's planned parts."""
    return tuple(p for p in planned if p in (Part.fingerprint, Part.numerics))


def woke(line: str) -> bool:
    """vLLM's line that a sleeping engine is being woken (its answers after it are asked again)."""
    return WAKE_LINE in line
