"""The fake clock's autojump (sparkd.testing): "every task is blocked" comes from the event loop itself, as trio's
autojump clock hears it from trio's run loop, through asyncio's public selector API."""

from __future__ import annotations

import asyncio
import os

import anyio
import anyio.lowlevel
import pytest

from sparkd.testing import FakeClock, all_tasks_blocked, fakes
from sparkd.testing.fakes import FAKE_PID_BASE, FakeRuntime

pytestmark = pytest.mark.anyio


async def test_all_tasks_blocked_waits_for_every_task_that_can_run() -> None:
    steps: list[int] = []

    async def busy() -> None:
        for n in range(200):  # runnable all along: it never waits on anything
            await anyio.lowlevel.checkpoint()
            steps.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        await all_tasks_blocked()
        assert len(steps) == 200


async def test_a_task_asleep_on_a_real_timer_is_blocked() -> None:
    woke: list[bool] = []

    async def nap() -> None:
        await anyio.sleep(3600)
        woke.append(True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(nap)
        with anyio.fail_after(5):
            await all_tasks_blocked()
        assert woke == []
        tg.cancel_scope.cancel()


async def test_run_until_jumps_to_each_sleeper_in_turn() -> None:
    clock = FakeClock(start=0.0)
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(clock.now())

    async with anyio.create_task_group() as tg:
        for seconds in (300.0, 10.0, 86_000.0):
            tg.start_soon(sleeper, seconds)
        with anyio.fail_after(5):
            passed = await clock.run_until(lambda: len(woke) == 3)
    assert (passed, woke) == (86_000.0, [10.0, 300.0, 86_000.0])


def test_another_loop_is_refused_with_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"loop_factory.*new_event_loop"):
        asyncio.run(all_tasks_blocked())


def test_the_fake_runtimes_pids_are_no_hosts_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 4000, a CI host's own process of that pid kept the watch's pidfd thread blocked, and run_until held the
    fake clock 2 real seconds for it at every step: an hour of fake time ran past the 300 s timeout (CI-like, 12-06)."""
    pids = [FakeRuntime().start().pid for _ in range(3)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.pidfd_open(pid)
    taken = {FAKE_PID_BASE, FAKE_PID_BASE + 1}  # as if the host's processes held them
    monkeypatch.setattr(fakes.psutil, "pid_exists", lambda pid: pid in taken)
    assert FakeRuntime().start().pid == FAKE_PID_BASE + 2
