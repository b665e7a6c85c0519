"""The memory settle, the restart gate and the records, in the real daemon loop with fake parts and a meminfo
file the test writes (scripted histories, no sleep)."""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest
from fakememinfo import Meminfo
from loop_harness import config, running

from sparkd.commands import reset
from sparkd.daemon.views.recorder import DaemonRecorder
from sparkd.recorder.record import decode, encode
from sparkd.recorder.ring import read_ring
from sparkd.testing import FakeClock, FakeRuntime

GIB, MIB = 1 << 30, 1 << 20


def gated(tmp: Path, meminfo: Meminfo, **recorder: Any) -> Any:
    return config(tmp, guard={"enabled": False, "meminfo_path": str(meminfo.path)},
                  recorder={"enabled": False, "settle_s": 2, "settle_band": "128 MiB", "settle_timeout_s": 30,
                            "reboot_after_falls": 3, "reboot_min_fall": "256 MiB", **recorder},
                  restart={"backoff_initial_s": 1, "budget_failures": 50, "consecutive_limit": 0})


@pytest.mark.anyio
async def test_restarts_that_keep_losing_memory_open_the_breaker_with_reboot_needed(tmp_path: Path) -> None:
    meminfo = Meminfo(tmp_path / "meminfo", 100 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(gated(tmp_path, meminfo), runtime, clock) as node:
        for _ in range(3):
            await node.until_state("ready")
            runtime.crash()
            meminfo.set(meminfo.available - GIB)  # what the killed vLLM held, never returned
            await node.until_state("backoff")
        await node.until_state("failed")
        status = node.status()
        assert status["last_failure"]["class"] == "reboot_needed"
        assert status["last_failure"]["message"].startswith(
            "Reboot needed: 3 restarts lost 3.0 GiB that was never returned (MemAvailable after each stop: "
            "100.0 GiB → 99.0 GiB → 98.0 GiB → 97.0 GiB)")
        assert status["launches"] == 3 and status["breaker"]["open"]
        assert node.daemon.start_guard.unreturned == 3 * GIB
        metrics = node.daemon.metrics.render().decode()
        assert 'sparkd_reboot_needed{node="scripted"} 1.0' in metrics
        assert 'sparkd_memory_unreturned_bytes{node="scripted"} 3.221225472e+09' in metrics
        # The operator reboots (here: the memory comes back) and resets: the count starts over and vLLM runs.
        meminfo.set(100 * GIB)
        await node.command(reset)
        await node.until_state("ready")
        assert node.daemon.start_guard.verdict is None
        assert [b["available"] for b in node.status()["recorder"]["baselines"]] == [100 * GIB]


@pytest.mark.anyio
async def test_memory_that_comes_back_keeps_the_restarts_going(tmp_path: Path) -> None:
    meminfo = Meminfo(tmp_path / "meminfo", 100 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(gated(tmp_path, meminfo), runtime, clock) as node:
        for _ in range(5):
            await node.until_state("ready")
            runtime.crash()
            await node.until_state("backoff")
        await node.until_state("ready")
        assert node.daemon.start_guard.verdict is None and node.status()["launches"] == 6


@pytest.mark.anyio
async def test_a_start_waits_for_memory_to_settle_and_shows_it_as_a_phase(tmp_path: Path) -> None:
    meminfo = Meminfo(tmp_path / "meminfo", 40 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(gated(tmp_path, meminfo), runtime, clock) as node:
        await node.until_state("ready")
        runtime.crash()
        meminfo.set(20 * GIB)  # the reaper of the killed vLLM still holds 20 GiB
        await node.until(lambda: node.status().get("phase") == "memory_settle")
        started = clock.now()
        for step in range(10):  # ... and gives back all but 1 GiB of it over 5 s
            await node.until(lambda step=step: clock.now() >= started + 0.5 * (step + 1))
            meminfo.set(20 * GIB + 19 * GIB // 10 * (step + 1))
        await node.until(lambda: node.daemon.sup.machine.launches == 2)
        waited = clock.now() - started
        assert 7.0 <= waited <= 8.5, waited  # 5 s of return, then 2 s stable
        history = [h.get("phase") for h in node.status()["history"] if h.get("state") == "preflight"]
        assert history[-1] == "memory_settle"
        assert abs(node.status()["recorder"]["last_settle"]["available"] - 39 * GIB) < MIB


@pytest.mark.anyio
async def test_a_restart_whose_memory_is_back_at_the_last_baseline_starts_at_once(tmp_path: Path) -> None:
    """The settle waits for memory the reaper still holds; once MemAvailable is back where the last start found it,
    nothing is held and no fall could be read from waiting longer (issue 36: the settle was a restart's overhead)."""
    meminfo = Meminfo(tmp_path / "meminfo", 40 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(gated(tmp_path, meminfo), runtime, clock) as node:
        await node.until_state("ready")
        runtime.crash()
        meminfo.set(20 * GIB)
        await node.until(lambda: node.status().get("phase") == "memory_settle")
        started = clock.now()
        await node.until(lambda: clock.now() >= started + 1.0)
        meminfo.set(40 * GIB - 100 * MIB)  # back, within half of reboot_min_fall
        await node.until(lambda: node.daemon.sup.machine.launches == 2)
        assert clock.now() - started <= 1.5, "no settle_s wait once the memory is back"
        assert node.status()["recorder"]["last_settle"]["available"] == 40 * GIB - 100 * MIB


@pytest.mark.anyio
async def test_the_settle_gives_up_at_its_timeout_and_keeps_no_baseline(tmp_path: Path) -> None:
    meminfo = Meminfo(tmp_path / "meminfo", 40 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = gated(tmp_path, meminfo, settle_timeout_s=5)
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        runtime.crash()

        async def flicker() -> None:  # 1 GiB up and down every 0.1 s, under the last baseline: never within the band
            for step in itertools.count():
                meminfo.set(38 * GIB + (GIB if step % 2 else 0))
                await clock.sleep(0.1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(flicker)
            await node.until(lambda: node.daemon.sup.machine.launches == 2)
            tg.cancel_scope.cancel()
        assert node.status()["recorder"]["last_settle"]["settled"] is False
        assert len(node.status()["recorder"]["baselines"]) == 1  # only the first start's


@pytest.mark.anyio
async def test_a_record_tells_the_state_the_memory_and_what_happened(tmp_path: Path) -> None:
    meminfo = Meminfo(tmp_path / "meminfo", 40 * GIB)
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = gated(tmp_path, meminfo, enabled=True, interval_s=60)  # its own records: at the start and at the exit
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        recorder = node.daemon.recorder
        assert isinstance(recorder, DaemonRecorder)
        record = decode(encode(recorder.record()))
        assert record.state == "ready" and record.available == 40 * GIB and record.pid is not None
        assert "preflight → starting" in record.events and "starting → ready" in record.events
        runtime.crash()
        await node.until_state("backoff")
        record = recorder.record()
        assert any(e.startswith("ready → stopping: ") for e in record.events), record.events
        assert recorder.record().events == ()  # each event once
    first, *_, last = read_ring(tmp_path / "state" / "recorder.ring")
    assert any(e.startswith("sparkd ") and "started" in e for e in first.events)
    assert last.clean_exit and any(e.startswith("sparkd exits cleanly") for e in last.events)


def _riding(tmp_path: Path) -> tuple[Meminfo, Any]:
    meminfo = Meminfo(tmp_path / "meminfo", 40 * GIB)
    (tmp_path / "pressure").write_text("some avg10=1.50 avg60=0.00 avg300=0.00 total=10\n"
                                       "full avg10=0.25 avg60=0.00 avg300=0.00 total=5\n")
    cfg = config(tmp_path, guard={"enabled": True, "meminfo_path": str(meminfo.path), "kernel_log": False,
                                  "pressure_path": str(tmp_path / "pressure"), "psi_trigger": None,
                                  "max_interval_s": 0.05, "warn_below": "1 GiB", "stop_below": "512 MiB",
                                  "kill_below": "256 MiB"},
                 recorder={"enabled": True, "interval_s": 0.05})
    return meminfo, cfg


@pytest.mark.anyio
async def test_the_records_ride_the_guards_samples(tmp_path: Path) -> None:
    """With the memory guard sampling at least as often as the recorder records, each record is made right after a
    guard sample, in the guard's own wake-up, and from its sample: the daemon reads meminfo and PSI once per record,
    and wakes once, not twice."""
    meminfo, cfg = _riding(tmp_path)
    async with running(cfg, FakeRuntime(), FakeClock()) as node:
        await node.until_state("ready")
        recorder, guard = node.daemon.recorder, node.daemon.guard
        assert isinstance(recorder, DaemonRecorder) and guard is not None and recorder.memory.meminfo is not None
        own = recorder.memory.meminfo
        reads: list[int] = []
        real_read = own.read
        own.read = lambda: (reads.append(1), real_read())[1]  # type: ignore[method-assign]
        in_guards_wake_up: list[bool] = []
        real_tick = recorder.tick

        def tick(taken: Any = None) -> None:
            in_guards_wake_up.append(any(frame.function == "_stepped" for frame in inspect.stack()))
            real_tick(taken)

        recorder.tick = tick  # type: ignore[method-assign]
        records, samples = recorder.records, guard.counters.samples
        meminfo.set(30 * GIB)
        with anyio.fail_after(20):
            while recorder.records < records + 8:
                await anyio.sleep(0.01)
        # without the guard's samples every record reads for itself (8 reads or more); a loaded machine may delay
        # a sample past a record's time now and then, and that record reads for itself (a loaded run: 4 reads and 7
        # samples for 8 records)
        assert len(reads) <= 4 and guard.counters.samples - samples >= 8 - len(reads)
        assert in_guards_wake_up.count(True) >= len(in_guards_wake_up) - 4
        record = recorder.record(taken=guard.latest)
        assert record.available == 30 * GIB and record.psi_some == 1.5 and record.psi_full == 0.25


@pytest.mark.anyio
async def test_a_guard_that_stops_stepping_does_not_stop_the_records(tmp_path: Path) -> None:
    """The guard's loop held (an action of its waits out a stop's grace): after three intervals without a step the
    recorder records on its own, reading meminfo itself, until the guard steps again."""
    _, cfg = _riding(tmp_path)
    async with running(cfg, FakeRuntime(), FakeClock()) as node:
        await node.until_state("ready")
        recorder, guard = node.daemon.recorder, node.daemon.guard
        assert isinstance(recorder, DaemonRecorder) and guard is not None and recorder.memory.meminfo is not None
        held = anyio.Event()

        async def held_step() -> None:
            await held.wait()

        guard.step = held_step  # type: ignore[method-assign,assignment]
        own = recorder.memory.meminfo
        reads: list[int] = []
        real_read = own.read
        own.read = lambda: (reads.append(1), real_read())[1]  # type: ignore[method-assign]
        records = recorder.records
        with anyio.fail_after(20):
            while recorder.records < records + 5:
                await anyio.sleep(0.01)
        held.set()
        assert len(reads) >= 4
