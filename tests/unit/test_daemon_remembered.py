"""What the lifecycle remembers across a daemon restart (``lifecycle.json``): every field round-trips, and the real
loop over the same state directory carries on where the killed daemon left off — the restart budget, the count of
failures in a row, the operator's intent — while a shutdown leaves the intent as it was (tests/MUTATION.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loop_harness import config, running
from structlog.testing import CapturingLogger

from sparkd.commands import stop
from sparkd.daemon.loop import remembered
from sparkd.state.files import json_state
from sparkd.state.schema import LIFECYCLE
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.policy import RestartState, Strike
from sparkd.supervisor.states import Intent, Remembered
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio


EVERY_FIELD = Remembered(
    intent=Intent.stop,
    restart_state=RestartState(consecutive=2, waits=3, strikes=(
        Strike(at=900.0, weight=1, cls=FailureClass.engine_dead),
        Strike(at=950.0, weight=2, cls=FailureClass.killed_by_guard))),
    breaker_reason="3 failures in 30 min (restart budget 3); fix the cause, then run `sparkctl reset`",
    backoff_until=1010.0,
    last_failure=Failure(FailureClass.oom, "vLLM ran out of memory", 1, None, "CUDA out of memory"),
)


def test_every_remembered_field_round_trips_through_the_file(tmp_path: Path) -> None:
    """Written by one daemon, read by the next one in another monotonic epoch: the same lifecycle, but for the
    waits, which are not kept (only the next delay depends on them)."""
    writer, reader = FakeClock(start=1000.0), FakeClock(start=5.0, wall_offset=1_800_000_995.0)  # same wall time
    path = tmp_path / "lifecycle.json"
    json_state(path, LIFECYCLE, log=CapturingLogger(), clock=writer.wall).write(remembered.to_json(EVERY_FIELD, writer))
    back = remembered.load(path, reader, CapturingLogger())
    shift = reader.now() - writer.now()
    assert back == Remembered(
        intent=EVERY_FIELD.intent,
        restart_state=RestartState(consecutive=2, waits=0, strikes=tuple(
            Strike(s.at + shift, s.weight, s.cls) for s in EVERY_FIELD.restart_state.strikes)),
        breaker_reason=EVERY_FIELD.breaker_reason,
        backoff_until=1010.0 + shift,
        last_failure=EVERY_FIELD.last_failure,
    )
    assert json.loads(path.read_text())["version"] == remembered.VERSION


async def test_the_restart_budget_survives_a_daemon_restart(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path, restart={"budget_failures": 3, "jitter": 0}), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.crash_into("backoff", times=2)
    async with running(cfg, runtime, clock) as again:
        await again.crash_into("failed")  # the third failure in the window, two of them before the restart
        assert "3 failures" in again.status()["breaker"]["reason"]


async def test_the_count_of_failures_in_a_row_survives_a_daemon_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path, restart={"budget_failures": 100, "consecutive_limit": 3, "jitter": 0,
                                    "budget_window_s": 60})
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.crash_into("backoff", times=2)
    clock.advance(3600)  # the budget window is long past; the failures in a row are not
    async with running(cfg, runtime, clock) as again:
        await again.crash_into("failed")
        assert "3 failures in a row" in again.status()["breaker"]["reason"]


async def test_a_daemon_shutdown_stops_vllm_but_the_next_daemon_starts_it_again(tmp_path: Path) -> None:
    """SIGTERM (a reboot, `systemctl stop sparkd`) is not the operator's `sparkctl stop`: the intent stays run."""
    cfg, runtime, clock = config(tmp_path), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        node.daemon.sup.shutdown()
        await node.until(lambda: node.daemon.sup.idle())
        assert node.state == "stopped" and runtime.current is None
    async with running(cfg, runtime, clock) as again:
        await again.until_state("ready")
        assert len(runtime.launches) == 2 and again.status()["intent"] == "run"


async def test_after_sparkctl_stop_a_shutdown_and_a_restart_leave_vllm_stopped(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        assert (await node.command(stop)).ok
        await node.until_state("stopped")
        node.daemon.sup.shutdown()
        await node.until(lambda: node.daemon.sup.idle())
    async with running(cfg, runtime, clock) as again:
        await again.until(lambda: again.state != "adopting")
        await again.settled()
        assert again.state == "stopped" and again.status()["intent"] == "stop" and len(runtime.launches) == 1

