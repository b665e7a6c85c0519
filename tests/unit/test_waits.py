"""sparkd.host.waits: a flag that ends the waits it interrupts, and an fd's readiness within a timeout — each
what it promises, at the cost it promises (no task spawned; the fd and timer released however the wait ends)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import anyio
import pytest
from taskcount import tasks_started

from sparkd.host.waits import Alarm, Flag, readable_within
from sparkd.runtime.filewatch import FileWatch


def test_a_flag_set_elsewhere_ends_the_wait_it_interrupts_at_once() -> None:
    async def main() -> tuple[float, bool, bool]:
        flag = Flag()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _set_after(flag, 0.05))
            started = time.monotonic()
            with flag.interrupts(timeout_s=30) as scope:
                await anyio.sleep(30)
            waited = time.monotonic() - started
        return waited, scope.cancelled_caught, flag.is_set()

    waited, caught, is_set = anyio.run(main)
    assert waited < 10 and caught and is_set


async def _set_after(flag: Flag, seconds: float) -> None:
    await anyio.sleep(seconds)
    flag.set()


def test_a_flag_already_set_ends_the_wait_at_its_first_await_and_the_timeout_ends_it_otherwise() -> None:
    async def main() -> tuple[float, float]:
        done = Flag()
        done.set()
        done.set()  # twice is once
        started = time.monotonic()
        with done.interrupts(timeout_s=30):
            await anyio.sleep(30)
        set_s = time.monotonic() - started
        started = time.monotonic()
        with Flag().interrupts(timeout_s=0.05) as scope:
            await anyio.sleep(30)
        assert scope.cancelled_caught
        await done.wait()  # returns: it is set
        return set_s, time.monotonic() - started

    set_s, timeout_s = anyio.run(main)
    assert set_s < 10 and timeout_s < 10


def test_a_flag_forgets_the_scopes_it_no_longer_interrupts() -> None:
    async def main() -> int:
        flag = Flag()
        for _ in range(3):
            with flag.interrupts(timeout_s=0.001):
                await anyio.sleep(1)
        return len(flag._scopes)

    assert anyio.run(main) == 0


def test_readable_within_says_readable_or_timed_out_and_releases_the_fd_however_it_ends() -> None:
    quiet_r, quiet_w = os.pipe()
    busy_r, busy_w = os.pipe()

    async def main() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        timed_out = await readable_within(busy_r, 0.05)
        os.write(busy_w, b"x")
        readable = await readable_within(busy_r, 30)
        with anyio.move_on_after(0.05):  # cancelled by a scope around it, as any wait
            await readable_within(quiet_r, 30)
        released = not loop.remove_reader(busy_r) and not loop.remove_reader(quiet_r)  # False: none was left
        return timed_out, readable, released

    try:
        assert anyio.run(main) == (False, True, True)
    finally:
        for fd in (quiet_r, quiet_w, busy_r, busy_w):
            os.close(fd)


def test_a_file_watch_wait_starts_no_task(tmp_path: Path) -> None:
    """The log follower's wait, many times a minute at rest: one scope, no task group (it was two tasks a wait)."""
    path = tmp_path / "vllm.out"
    path.write_bytes(b"")
    watch = FileWatch.open(path)
    if watch is None:
        pytest.skip("no inotify here")  # CI's kernel has it; the follower polls where it does not

    async def main() -> tuple[int, int]:
        done = Flag()

        async def written() -> None:
            with path.open("ab") as out:
                out.write(b"line\n")
            await watch.wait(done, 30)

        async def ended() -> None:
            done.set()
            await watch.wait(done, 30)

        return (await tasks_started(written))[0], (await tasks_started(ended))[0]

    try:
        assert anyio.run(main) == (0, 0)
    finally:
        watch.close()


def test_an_alarm_sets_itself_after_its_last_reset_and_not_once_cancelled() -> None:
    """The flight recorder's watch on the guard: each record pushes the alarm back, and only a guard that stopped
    stepping lets it ring. Pushed back, it rings its full delay after the push; cancelled, never."""

    async def main() -> tuple[bool, bool, float, bool]:
        alarm = Alarm(0.3)
        for _ in range(3):  # pushed back three times, 0.1 s apart: not set in 0.3 s of its making
            await anyio.sleep(0.1)
            alarm.reset()
        not_yet = alarm.is_set()
        pushed = time.monotonic()
        with anyio.fail_after(10):
            await alarm.wait()
        rang_after = time.monotonic() - pushed
        quiet = Alarm(0.05)
        quiet.cancel()
        await anyio.sleep(0.2)
        return not_yet, alarm.is_set(), rang_after, quiet.is_set()

    not_yet, rang, rang_after, quiet_rang = anyio.run(main)
    assert not not_yet and rang and rang_after >= 0.25 and not quiet_rang
