"""Fakes for running sparkd's real daemon loop in-process, in milliseconds (honcho's way).

- :class:`FakeClock`: monotonic and wall time that move only when told, or jump to the next sleeper once every
  task is blocked (:meth:`FakeClock.run_until`), so a 300 s backoff passes in microseconds. "Every task is
  blocked" is the event loop's own word, as trio's autojump clock hears it from trio's run loop: the loop of
  :func:`new_event_loop` says so when it would wait for I/O or a timer with nothing ready to run. Run the tests on
  it (``anyio_backend = ("asyncio", {"loop_factory": new_event_loop})``, as tests/conftest.py does).
- :class:`FakeRuntime`: instances that live in memory; the script makes them print lines, become ready,
  crash or ignore SIGTERM; it records every launch and stop (with its grace).
- :class:`FakeProbes`: /health answers 200 once the instance is serving, refused before.
- :class:`FakeAnswers`: the acceptance gate's answers from the serving instance, as a healthy, a changed or a
  garbling engine gives them.
- :class:`FakeNotifier`: the systemd notifications, recorded.
- :func:`passing_check` / :func:`failing_check`: preflight checks with a scripted verdict.

``tests/unit/test_daemon_loop.py`` shows a scripted history end to end.
"""

from sparkd.testing.clock import FakeClock, all_tasks_blocked, new_event_loop
from sparkd.testing.fakes import FakeAnswers, FakeNotifier, FakeProbes, FakeRuntime, failing_check, passing_check

__all__ = ["FakeAnswers", "FakeClock", "FakeNotifier", "FakeProbes", "FakeRuntime", "all_tasks_blocked",
           "failing_check", "new_event_loop", "passing_check"]
