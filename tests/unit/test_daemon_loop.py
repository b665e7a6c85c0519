"""The daemon's real loop, in-process, with fakes (sparkd.testing): scripted histories that run in milliseconds.

Each test builds the real :class:`~sparkd.daemon.app.Daemon` (supervisor, node, watch, view, control) over a
FakeRuntime and a FakeClock, runs it in a task group, and drives it through the same control commands sparkctl
sends. The process-level tests (tests/integration) stay the end-to-end layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from loop_harness import Node, config, running

from sparkd.commands import reset, restart, start, stop
from sparkd.guard.policy import Action, Decision, Level
from sparkd.runtime.base import LaunchError
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.testing import (
    FakeClock,
    FakeRuntime,
    all_tasks_blocked,
    failing_check,
)

pytestmark = pytest.mark.anyio


async def test_a_crash_backs_off_with_jitter_then_the_instance_is_ready_again(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock, rand=0.9) as node:
        await node.until_state("ready")
        runtime.crash(exit_code=1)
        await node.until_state("backoff")
        status = node.status()
        assert status["last_failure"]["class"] == "unknown"
        # 10 s base, jitter 0.1 at rand 0.9: 10 * (1 + 0.1 * 0.8) = 10.8 s — the node's draw reached the policy.
        assert status["backoff_until"] - clock.wall() == pytest.approx(10.8)
        waited = await node.until_state("ready")
        assert waited == pytest.approx(10.8, abs=0.5)
        assert len(runtime.launches) == 2 and status["launches"] == 1
        assert node.status()["restarts"] == 1
        await node.settled()  # the incident is written in a worker thread
        incidents = list((tmp_path / "state" / "incidents").iterdir())
        assert len(incidents) == 1 and json.loads((incidents[0] / "incident.json").read_text())["class"] == "unknown"
        assert node.daemon.evidence.counters.failures == {"unknown": 1}


async def test_an_exit_0_is_a_failure_even_while_health_still_says_ok(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        pid = runtime.crash(exit_code=0)
        runtime.procs[pid].serving = True  # /health would still answer 200: only the exit tells
        await node.until(lambda: node.status()["last_failure"] is not None)
        failure = node.status()["last_failure"]
        assert failure["class"] == "engine_dead" and failure["exit_code"] == 0


async def test_budget_spent_breaker_holds_through_stop_start_and_a_daemon_restart_until_reset(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path, restart={"budget_failures": 2}), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        for _ in range(2):
            await node.until_state("ready")
            runtime.crash(exit_code=1)
            await node.until(lambda: node.state in ("backoff", "failed"))
        await node.until_state("failed")
        assert node.status()["breaker"]["open"]
        assert (await node.command(stop)).ok
        assert node.state == "failed"  # stop records the intent; the breaker stays open
        refused = await node.command(start)
        assert not refused.ok and "breaker is open" in refused.error
        assert len(runtime.launches) == 2
    # The daemon is killed and restarted (a new one over the same state directory): the breaker is remembered.
    async with running(cfg, runtime, clock) as again:
        assert again.state == "failed" and again.status()["breaker"]["open"]
        assert not (await again.command(start)).ok
        assert (await again.command(reset)).ok
        assert again.state == "stopped"  # reset closes the breaker; the intent (stop) is remembered too
        assert (await again.command(start)).ok
        await again.until_state("ready")
        assert len(runtime.launches) == 3


async def test_a_stopped_node_stays_stopped_across_a_daemon_restart(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        assert (await node.command(stop)).ok
        await node.until_state("stopped")
    async with running(cfg, runtime, clock) as again:
        await again.until(lambda: again.state != "adopting")
        assert again.state == "stopped" and again.status()["intent"] == "stop"
        assert len(runtime.launches) == 1


async def test_the_remaining_backoff_survives_a_daemon_restart(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path, restart={"jitter": 0}), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.crash_into("backoff")
    clock.advance(4)
    async with running(cfg, runtime, clock) as again:
        assert again.state == "backoff"
        assert again.status()["backoff_until"] - clock.wall() == pytest.approx(6)
        assert await again.until_state("ready") == pytest.approx(6, abs=0.5)


async def test_a_failed_preflight_backs_off_with_the_same_jitter(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    checks = (failing_check("port 8000 held by pid 7", FailureClass.port_in_use),)
    async with running(config(tmp_path), runtime, clock, rand=0.0, checks=checks) as node:
        await node.until_state("backoff")
        assert node.status()["backoff_until"] - clock.wall() == pytest.approx(9.0)  # 10 s × (1 − 0.1)
        assert runtime.launches == []


async def test_the_daemon_draws_a_fresh_jitter_for_every_backoff(tmp_path: Path) -> None:
    """The daemon's own draws (nothing injected): were the draw a constant, every node would sit at the same point
    of its jitter range and two nodes would retry in lockstep — the thing jitter exists to prevent."""
    runtime, clock = FakeRuntime(), FakeClock()
    checks = (failing_check("port 8000 held by pid 7", FailureClass.port_in_use),)
    async with running(config(tmp_path, restart={"budget_failures": 99}), runtime, clock, rand=None,
                       checks=checks) as node:
        factors: list[float] = []  # each delay over its un-jittered base (10 s, doubling)

        def note(before: Any, after: Any, obs: Any) -> None:
            if after.state.value == "backoff":
                attempt = after.restart_state.consecutive + after.restart_state.waits
                factors.append((after.deadline - after.since) / (10.0 * 2 ** (attempt - 1)))

        node.listen(note)
        await node.until(lambda: len(factors) >= 4)
        assert all(0.9 <= f <= 1.1 for f in factors), factors
        assert len({round(f, 9) for f in factors}) == len(factors), f"one draw for every backoff: {factors}"


@pytest.mark.parametrize(("action", "grace"), [("stop", 7.0), ("kill", 0.0)])
async def test_a_guard_stop_or_kill_carries_its_grace_and_records_the_incident_once(tmp_path: Path, action: str,
                                                                                    grace: float) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        pid = runtime.current.instance.pid if runtime.current else 0
        daemon = node.daemon
        hooks = daemon.guard_hooks
        failure = Failure.of(FailureClass.killed_by_guard, "memory ran low", evidence="MemAvailable 3 GiB")
        hooks.write_evidence(failure, {"decision": "stop"})  # the guard writes before it signals
        await (hooks.stop_vllm(failure, grace) if action == "stop" else hooks.kill_vllm(failure))
        await node.until_state("backoff")
        await node.settled()
        assert runtime.stops == [(pid, grace)]
        incidents = list((tmp_path / "state" / "incidents").iterdir())
        assert len(incidents) == 1 and "killed_by_guard" in incidents[0].name
        assert daemon.evidence.counters.failures == {"killed_by_guard": 1}  # counted once, too
        assert node.status()["last_failure"]["class"] == "killed_by_guard"


async def test_a_restarted_daemon_adopts_the_running_instance_without_a_launch(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path), FakeRuntime(), FakeClock()
    instance = runtime.start(serving=True)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "instance.json").write_text(json.dumps(instance.to_record()))
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        assert runtime.launches == [] and node.status()["pid"] == instance.pid
        assert node.status()["launches"] == 0


async def test_restart_from_failed_closes_the_breaker_and_launches(tmp_path: Path) -> None:
    cfg, runtime, clock = config(tmp_path, restart={"budget_failures": 1}), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.crash_into("failed")
        assert (await node.command(restart)).ok
        await node.until_state("ready")
        assert not node.status()["breaker"]["open"]
        runtime.crash()
        await node.until_state("failed")  # the budget was forgotten: one failure opens it again, not zero


async def test_the_watchdog_is_petted_with_the_loops_last_progress_not_the_time(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        node.notifier.watchdog_s = 30.0
        wedged_at = node.daemon.sup.alive_at
        clock.advance(100)
        node.daemon.sup.alive_at = wedged_at  # the loop made no progress since
        async with anyio.create_task_group() as tg:
            tg.start_soon(node.daemon._watchdog)
            await all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert node.notifier.pets == [wedged_at]


async def test_status_shows_where_a_start_went(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until(lambda: runtime.current is not None)
        for line, seconds in (("Starting to load model /models/m...", 40), ("Model loading took 1.0 GiB memory "
                              "and 40.0 seconds", 25), ("Available KV cache memory: 3.00 GiB", 5)):
            runtime.say(line)
            await all_tasks_blocked()
            clock.advance(seconds)
        runtime.serve()
        await node.until_state("ready")
        timing = node.status()["start_timing"]
        assert set(timing["steps_s"]) >= {"preflight.scripted", "preflight", "queue", "runtime.launch"}
        assert timing["sparkd_s"] is not None and not timing["adopted"]
        assert timing["phases_s"]["loading_weights"] == pytest.approx(40)
        assert timing["phases_s"]["compiling"] == pytest.approx(25)
        assert timing["phases_s"]["kv_cache"] >= 5


@pytest.mark.parametrize("content", ['{"runtime": "process"}', '{"runtime": "fake", "pid": "abc", "create_time": 1}',
                                     "[1, 2, 3]", "\x00garbage", "directory"])
async def test_a_bad_instance_record_is_set_aside_and_never_crashes_the_daemon(tmp_path: Path, content: str) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    state = tmp_path / "state"
    state.mkdir()
    record = state / "instance.json"
    if content == "directory":
        record.mkdir()
    else:
        record.write_text(content)
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        assert len(runtime.launches) == 1
    assert list(state.glob("instance.json.bad-*")), "set aside, not deleted"


async def test_secrets_never_reach_the_vllm_log_or_an_incident(tmp_path: Path) -> None:
    token = tmp_path / "peer.token"
    token.write_text("peer-token-secret-42\n")
    cfg = config(tmp_path, launch={"api_key": "sk-never-shown"}, api={"token_file": str(token)})
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("ready")
        runtime.say("INFO non-default args: {'api_key': ['sk-never-shown']}", "token peer-token-secret-42 here")
        await all_tasks_blocked()
        runtime.crash()
        await node.until_state("backoff")
        shown = "\n".join(node.daemon.control.log_tail(100))
        assert "sk-never-shown" not in shown and "peer-token-secret-42" not in shown and "non-default" in shown
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "sk-never-shown" not in text and "peer-token-secret-42" not in text, path


class UnprovingRuntime(FakeRuntime):
    """A runtime whose instances never carry this node's launch marker (a reused PID, a forged record)."""

    def proven(self, record: dict[str, object], expected: object) -> bool:
        return False


async def test_a_record_the_runtime_cannot_prove_is_neither_adopted_nor_touched(tmp_path: Path) -> None:
    runtime, clock = UnprovingRuntime(), FakeClock()
    stranger = runtime.start(serving=True)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "instance.json").write_text(json.dumps(stranger.to_record()))
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        assert len(runtime.launches) == 1 and node.status()["pid"] != stranger.pid
        assert runtime.procs[stranger.pid].exit is None and runtime.stops == []


async def test_an_engine_that_does_not_answer_is_waited_for_with_jitter_spending_no_budget(tmp_path: Path) -> None:
    """host_unavailable: the waits back off (jittered), never open the breaker, and do not count toward the
    consecutive limit: the first crash once the engine is back is the first in a row."""
    cfg = config(tmp_path, restart={"budget_failures": 2, "consecutive_limit": 2})
    runtime, clock = FakeRuntime(), FakeClock()
    runtime.launch_error = LaunchError("Error while fetching server API version", unavailable=True)
    async with running(cfg, runtime, clock, rand=0.0) as node:
        states: list[str] = []
        node.listen(lambda before, after, obs: states.append(after.state.value))
        await node.until_state("backoff")
        assert node.status()["backoff_until"] - clock.wall() == pytest.approx(9.0)  # 10 s × (1 − 0.1)
        assert node.status()["last_failure"]["class"] == "host_unavailable"
        await node.until(lambda: node.daemon.sup.machine.restart_state.waits == 5 and node.state == "backoff")
        assert not node.status()["breaker"]["open"] and runtime.launches == []
        runtime.launch_error = None  # the engine answers again
        await node.until_state("ready")
        runtime.crash()
        await node.until(lambda: node.state in ("backoff", "failed"))
        assert node.state == "backoff" and "failed" not in states and len(runtime.launches) == 1
        assert node.daemon.sup.machine.restart_state.consecutive == 1  # the first failure in a row
        # the run was not stable: the delay still grows from the waits before it (6th try: 300 s cap × 0.9)
        assert node.status()["backoff_until"] - clock.wall() == pytest.approx(270.0)


class GuardGate:
    """The guard as the start gate sees it: refusing starts (its cool-down after a stop) until opened."""

    latest = None  # no memory sample to show
    start_allowed = False
    sampler = SimpleNamespace(kernel=None)  # no kernel log read

    def __init__(self) -> None:
        self.decision = Decision(Action.cooldown, Level.stop, False, "cool-down after the guard's stop 1.0 s ago",
                                 available=3 << 30, at=0.0)

    def evidence(self) -> dict[str, Any]:
        return {}


async def test_a_start_the_guard_refuses_is_a_wait_not_a_failure(tmp_path: Path) -> None:
    """Soak seed 11: after a guard stop the guard refuses starts for its grace and cool-down; each refused
    start counted as a failure, so one guard stop (weight 2) and its own cool-down opened the breaker."""
    cfg = config(tmp_path, restart={"budget_failures": 3, "consecutive_limit": 3, "backoff_initial_s": 1,
                                    "backoff_max_s": 1})
    runtime, clock = FakeRuntime(), FakeClock()
    gate = GuardGate()
    gate.start_allowed = True  # headroom until the guard's stop
    async with running(cfg, runtime, clock, guard=gate) as node:
        await node.until_state("ready")
        daemon = node.daemon
        gate.start_allowed = False  # the guard's cool-down after its stop
        await daemon.guard_hooks.stop_vllm(Failure.of(FailureClass.killed_by_guard, "memory ran low"), 0.0)
        await node.until(lambda: _refusals(node) >= 3 or node.state == "failed", limit_s=600)
        assert node.state != "failed", node.status()["breaker"]
        assert node.status()["last_failure"]["class"] == "host_unavailable"
        assert "memory guard refuses a start" in node.status()["last_failure"]["message"]
        gate.start_allowed = True  # headroom again: nothing refuses the start
        await node.until_state("ready")
        assert not node.status()["breaker"]["open"] and len(runtime.launches) == 2


def _refusals(node: Node) -> int:
    return sum(1 for h in node.status()["history"] if h["state"] == "backoff") - 1
