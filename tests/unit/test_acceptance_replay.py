"""When the fingerprint is replayed while serving (sparkd/supervisor/acceptance/replay.py): at the interval, only once
the engine has been idle long enough, never while a request runs or waits."""

from __future__ import annotations

from sparkd.supervisor.acceptance.gate import Part
from sparkd.supervisor.acceptance.replay import Idle, due, observe_load, ran, replay_parts

TIMES = {"interval_s": 900.0, "idle_s": 30.0}


def test_due_after_the_interval_once_idle_long_enough() -> None:
    idle = ran(Idle(), 0.0)
    idle = observe_load(idle, 0, 0, 880.0)
    assert due(idle, 900.0, **TIMES) is None, "idle for 20 s only"
    assert due(idle, 910.0, **TIMES) == "replay: 910 s since the last, the engine idle for 30 s"
    assert due(ran(idle, 910.0), 911.0, **TIMES) is None, "just ran"


def test_a_request_ends_the_idle_spell_and_an_unread_scrape_changes_nothing() -> None:
    idle = observe_load(ran(Idle(), 0.0), 0, 0, 100.0)
    assert observe_load(idle, None, None, 950.0) == idle
    busy = observe_load(idle, 1, 0, 950.0)
    assert busy.idle_since is None and due(busy, 2000.0, **TIMES) is None
    assert due(observe_load(idle, 0, 2, 950.0), 2000.0, **TIMES) is None, "waiting requests are users too"
    again = observe_load(busy, 0, 0, 1000.0)
    assert due(again, 1029.0, **TIMES) is None and due(again, 1030.0, **TIMES) is not None


def test_interval_zero_is_never() -> None:
    assert due(observe_load(Idle(), 0, 0, 0.0), 10_000.0, interval_s=0, idle_s=0) is None


def test_a_replay_runs_the_fingerprint_and_numerics_only() -> None:
    assert replay_parts(tuple(Part)) == (Part.fingerprint, Part.numerics)
