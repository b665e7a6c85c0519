"""The sampler's interval and sources, and the guard loop replaying scripted memory histories.

The node is fixture files the test rewrites in place (meminfo, pressure, kmsg) and a fake clock; the daemon
is :class:`FakeHooks`, which records what the guard asked for, in order. The kill tests signal a real
`sleep` process that this test started.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from structlog.testing import capture_logs

from sparkd.config import GuardConfig
from sparkd.guard import Action, Decision, Guard, Level, Sampler, next_interval
from sparkd.guard.guard import PID_REFRESH_NEAR_S, PID_REFRESH_S, pid_refresh_s
from sparkd.guard.sample import GIB, MIB, Sample
from sparkd.supervisor.failures import Failure, FailureClass

PSI_CALM = "some avg10=0.00 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"


def meminfo_text(available: float, free: float | None = None) -> str:
    a = int(available * GIB) // 1024
    f = a if free is None else int(free * GIB) // 1024
    return (
        f"MemTotal:       {128 * GIB // 1024} kB\nMemFree:        {f} kB\nMemAvailable:   {a} kB\n"
        f"Cached:         {max(0, a - f)} kB\nSwapTotal:      0 kB\nSwapFree:       0 kB\n"
        f"Active:         1048576 kB\nInactive:       1048576 kB\nUnevictable:    0 kB\nShmem:          0 kB\n"
        f"Slab:           524288 kB\nPageTables:     1024 kB\n"
    )


class Node:
    """A fake /proc: files rewritten in place, as the kernel's change under an open fd."""

    def __init__(self, root: Path) -> None:
        self.meminfo = root / "meminfo"
        self.pressure = root / "pressure"
        self.kmsg = root / "kmsg"
        self.meminfo.write_text(meminfo_text(40))
        self.pressure.write_text(PSI_CALM)
        self.kmsg.write_bytes(b"")

    def set(self, available: float, free: float | None = None, psi_full: float = 0.0) -> None:
        with open(self.meminfo, "r+") as handle:
            handle.truncate(0)
            handle.write(meminfo_text(available, free))
        with open(self.pressure, "r+") as handle:
            handle.truncate(0)
            handle.write(PSI_CALM.replace("full avg10=0.00", f"full avg10={psi_full:.2f}"))

    def kernel(self, line: str) -> None:
        with open(self.kmsg, "ab") as handle:
            handle.write(f"3,1,1,-;{line}\n".encode())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeHooks:
    """The daemon's side, recorded: ``events`` in the order the guard asked."""

    def __init__(self, pids: set[int] | None = None) -> None:
        self.pids = pids or set()
        self.is_starting = False
        self.is_idle: bool | None = None
        self.events: list[tuple[Any, ...]] = []
        self.decisions: list[Decision] = []
        self.evidence_error: Exception | None = None
        self.alive_at_evidence: list[bool] = []
        self.listed = 0  # how often the guard asked for vLLM's PIDs (a listing of the tree, in the daemon)

    def vllm_pids(self) -> set[int]:
        self.listed += 1
        return set(self.pids)

    def starting(self) -> bool:
        return self.is_starting

    def idle(self) -> bool | None:
        return self.is_idle

    def on_decision(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def write_evidence(self, failure: Failure, evidence: dict[str, Any]) -> None:
        self.alive_at_evidence.append(all(_alive(pid) for pid in self.pids))
        self.events.append(("evidence", failure))
        if self.evidence_error is not None:
            raise self.evidence_error

    async def stop_vllm(self, failure: Failure, grace_s: float) -> None:
        self.events.append(("stop", failure, grace_s))

    async def kill_vllm(self, failure: Failure) -> None:
        self.events.append(("kill", failure))

    async def planned_restart(self, reason: str) -> None:
        self.events.append(("restart", reason))

    def names(self) -> list[str]:
        return [e[0] for e in self.events]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def config(node: Node, **overrides: Any) -> GuardConfig:
    return GuardConfig(
        **{
            "warn_below": 8 * GIB,
            "refuse_start_below": 16 * GIB,
            "stop_below": 4 * GIB,
            "kill_below": 2 * GIB,
            "recover_margin": GIB,
            "debounce_samples": 3,
            "cooldown_s": 15.0,
            "stop_grace_s": 30.0,
            "meminfo_path": node.meminfo,
            "pressure_path": node.pressure,
            "kmsg_path": node.kmsg,
            "psi_trigger": None,
            **overrides,
        }
    )


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A real process standing in for the vLLM tree; ended by PID if the test did not kill it."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def deaf_victim() -> Iterator[subprocess.Popen[bytes]]:
    """The same, deaf to SIGTERM (vLLM stuck in C code while loading); ended by PID if the test did not."""
    proc = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def make_guard(node: Node, hooks: FakeHooks, clock: FakeClock, **overrides: Any) -> Guard:
    cfg = config(node, **overrides)
    return Guard(lambda: cfg, hooks, sampler=Sampler(cfg, clock=clock), clock=clock)


async def replay(
    guard: Guard, node: Node, clock: FakeClock, history: list[float], *, step_s: float = 0.01
) -> list[Decision]:
    out = []
    for available in history:
        node.set(available)
        out.append(await guard.step())
        clock.now += step_s
    return out


# ---- the sampler


GI = float(GIB)


@pytest.mark.parametrize(("available", "starting", "debouncing", "interval"), [
    (40 * GI, False, False, 1.0),  # far: (40 - 4) / 16 GiB/s = 2.25 s, capped
    (8 * GI, False, False, 0.25),  # (8 - 4) / 16
    (5 * GI, False, False, 1 / 16),
    (4 * GI + 64 * MIB, False, False, 0.005),  # 4 ms of drain left: the floor of the interval
    (3 * GI, False, False, 1 / 16),  # under stop, acted on: the distance to the kill floor counts
    (3 * GI, False, True, 0.005),  # under stop, debouncing: every sample counts, take them fast
    (1 * GI, False, False, 0.005),  # under kill
    (40 * GI, True, False, 0.025),  # starting: always fast
    (4 * GI + 64 * MIB, True, False, 0.005),
])
def test_next_interval(node: Node, available: float, starting: bool, debouncing: bool, interval: float) -> None:
    """Distance to the next acting floor over the fill rate, clamped; fast while debouncing or starting."""
    got = next_interval(int(available), config(node), starting=starting, debouncing=debouncing)
    assert got == pytest.approx(interval)


def test_interval_is_tighter_than_earlyoom(node: Node) -> None:
    """At every distance the guard samples at least as often as earlyoom (headroom / 6000 MiB/s, 0.1–1 s)."""
    cfg = config(node)
    for mib in range(0, 40 * 1024, 97):
        available = cfg.stop_below + mib * MIB
        earlyoom = min(1.0, max(0.1, mib / 6000))
        assert next_interval(available, cfg, starting=False) <= earlyoom


def test_sampler_reads_every_source(node: Node) -> None:
    node.set(7, free=1, psi_full=12.5)
    node_cfg = config(node)
    with Sampler(node_cfg, clock=lambda: 5.0) as sampler:
        node.kernel("NVRM: Out of memory [NV_ERR_NO_MEMORY]")
        node.kernel("Out of memory: Killed process 77 (VLLM::Worker_TP)")
        s = sampler.read()
    assert (s.at, s.available, s.free) == (5.0, 7 * GIB, 1 * GIB)
    assert s.psi is not None and s.psi.full_avg10 == 12.5
    assert (s.nvrm_errors, s.vllm_oom_kills) == (1, 1)


def test_sampler_without_optional_sources(node: Node, tmp_path: Path) -> None:
    """No PSI, no kernel log, no trigger: still a sampler, on MemAvailable alone, saying what is off."""
    cfg = config(node, pressure_path=tmp_path / "none", kmsg_path=tmp_path / "none", psi_trigger="some 1 2000000")
    with Sampler(cfg) as sampler:
        s = sampler.read()
        assert s.psi is None and s.nvrm_errors == 0
        assert any("PSI off" in p for p in sampler.problems) and any("kernel log" in p for p in sampler.problems)
    with Sampler(config(node, kernel_log=False, psi_trigger="some 150000 1000000")) as sampler:
        assert sampler.kernel is None
        assert sampler.trigger is None and any("not permitted" in p for p in sampler.problems)


# ---- the loop


@pytest.mark.anyio
async def test_stop_writes_evidence_first(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """Falling through the stop floor: warn, then after the debounce evidence, the guard's own SIGTERM to the
    tree's root (by pidfd), then the daemon's stop with its grace."""
    hooks, clock = FakeHooks({victim.pid}), FakeClock()
    guard = make_guard(node, hooks, clock)
    decisions = await replay(guard, node, clock, [20, 7, 7, 7, 3.9, 3.9, 3.9, 3.9])
    assert [d.action for d in decisions] == [
        Action.ok,
        Action.ok,
        Action.ok,
        Action.warn,
        Action.warn,
        Action.warn,
        Action.stop,
        Action.cooldown,
    ]
    assert hooks.names() == ["evidence", "stop"]
    assert hooks.alive_at_evidence == [True]
    assert victim.wait(timeout=10) == -signal.SIGTERM
    assert [(k.signal, k.pids) for k in guard.signals] == [(signal.SIGTERM, (victim.pid,))]
    evidence, stop = hooks.events
    assert stop[1] is evidence[1] and stop[2] == 30.0
    failure: Failure = stop[1]
    assert failure.cls is FailureClass.killed_by_guard and failure.signal == signal.SIGTERM
    assert failure.evidence is not None and "MemAvailable 3.9 GiB is under the stop floor 4.0 GiB" in failure.evidence
    # on_decision hears changes only: ok, the start gate shutting (under 16 GiB), warn, stop, cooldown
    assert [(d.action, d.start_allowed) for d in hooks.decisions] == [
        (Action.ok, True),
        (Action.ok, False),
        (Action.warn, False),
        (Action.stop, False),
        (Action.cooldown, False),
    ]
    assert guard.counters.actions == {"warn": 1, "stop": 1, "cooldown": 1}
    assert not guard.start_allowed


@pytest.mark.anyio
async def test_kill_signals_the_tree_after_the_evidence(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """Under the kill floor the guard SIGKILLs the PIDs itself (by pidfd), after the evidence, then reports."""
    hooks, clock = FakeHooks({victim.pid}), FakeClock()
    guard = make_guard(node, hooks, clock)
    decisions = await replay(guard, node, clock, [1.5, 1.5, 1.5])
    assert decisions[-1].action is Action.kill
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert hooks.names() == ["evidence", "kill"]
    assert hooks.alive_at_evidence == [True]
    failure: Failure = hooks.events[1][1]
    assert failure.cls is FailureClass.killed_by_guard and failure.signal == signal.SIGKILL
    assert [(k.signal, k.pids) for k in guard.signals] == [(signal.SIGKILL, (victim.pid,))]


@pytest.mark.anyio
async def test_kill_escalating_a_stop_writes_no_second_evidence(node: Node,
                                                                deaf_victim: subprocess.Popen[bytes]) -> None:
    """A stop that does not work, and memory keeps falling to the kill floor during the grace: one incident,
    the guard's SIGTERM, then the kill."""
    hooks, clock = FakeHooks({deaf_victim.pid}), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1)
    decisions = await replay(guard, node, clock, [3.9, 3.0, 1.9])
    assert [d.action for d in decisions] == [Action.stop, Action.cooldown, Action.kill]
    assert hooks.names() == ["evidence", "stop", "kill"]
    assert [k.signal for k in guard.signals] == [signal.SIGTERM, signal.SIGKILL]
    assert deaf_victim.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.anyio
async def test_evidence_failure_does_not_stop_the_kill(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """A broken incident writer is logged and counted; the host still comes first."""
    hooks, clock = FakeHooks({victim.pid}), FakeClock()
    hooks.evidence_error = OSError("disk full")
    guard = make_guard(node, hooks, clock, debounce_samples=1)
    await replay(guard, node, clock, [1.0])
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert guard.counters.hook_errors == 1 and hooks.names() == ["evidence", "kill"]


@pytest.mark.anyio
async def test_dry_run_acts_on_nothing(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """Dry run: the decisions say what the guard would do, and nothing is written or signalled."""
    hooks, clock = FakeHooks({victim.pid}), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1, dry_run=True)
    decisions = await replay(guard, node, clock, [3.9, 1.5])
    assert [d.action for d in decisions] == [Action.stop, Action.kill]
    assert all(d.dry_run and d.reason.startswith("would ") for d in decisions)
    assert hooks.events == [] and guard.signals == []
    assert victim.poll() is None
    assert guard.counters.dry_run_actions == {"stop": 1, "kill": 1}


@pytest.mark.anyio
async def test_no_vllm_means_refuse_not_kill(node: Node) -> None:
    """With nothing running, low memory shuts the start gate and signals nobody."""
    hooks, clock = FakeHooks(set()), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1)
    decisions = await replay(guard, node, clock, [1.0, 10.0, 20.0])
    assert [d.action for d in decisions] == [Action.refuse_start, Action.refuse_start, Action.ok]
    assert hooks.events == [] and guard.start_allowed


@pytest.mark.anyio
async def test_at_rest_the_tree_is_listed_once_in_its_refresh_and_every_sample_where_it_matters(node: Node) -> None:
    """Listing vLLM's tree reads every task's `children` (milliseconds for a real vLLM's hundreds of threads): far from
    the floors with a tree known, the guard asks once per PID_REFRESH_S; while no tree is known, while vLLM starts and
    at the warn level, at every sample."""
    hooks, clock = FakeHooks({4242}), FakeClock()
    guard = make_guard(node, hooks, clock)
    await replay(guard, node, clock, [40.0] * 61, step_s=1.0)
    assert hooks.listed == 3  # at 0 s, 30 s and 60 s
    hooks.listed, hooks.is_starting = 0, True
    await replay(guard, node, clock, [40.0] * 10, step_s=1.0)
    assert hooks.listed == 10
    hooks.listed, hooks.is_starting = 0, False
    await replay(guard, node, clock, [7.0] * 10, step_s=1.0)  # under warn_below (8 GiB)
    assert hooks.listed >= 7  # every sample once the level is warn (after its debounce of 3 samples)
    empty_hooks, clock = FakeHooks(set()), FakeClock()
    guard = make_guard(node, empty_hooks, clock)
    await replay(guard, node, clock, [40.0] * 10, step_s=1.0)
    assert empty_hooks.listed == 10  # no vLLM yet: the next sample may find the one just started


@pytest.mark.anyio
async def test_nvrm_line_in_the_kernel_log_escalates(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """A driver out-of-memory line while MemAvailable is under the warn floor stops vLLM."""
    hooks, clock = FakeHooks({victim.pid}), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1)
    assert (await replay(guard, node, clock, [7.0]))[0].action is Action.warn
    node.kernel("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)")
    decision = (await replay(guard, node, clock, [7.0]))[0]
    assert decision.action is Action.stop and "NV_ERR_NO_MEMORY" in decision.reason


@pytest.mark.anyio
async def test_leak_trend_asks_for_a_restart_when_idle(node: Node) -> None:
    """A steady leak: the trend warns, and once vLLM is idle the guard asks for one planned restart."""
    hooks, clock = FakeHooks({4242}), FakeClock()
    guard = make_guard(node, hooks, clock, trend_restart_s=3000.0, trend_warn_s=3600.0)
    hooks.is_idle = False
    leak = [30.0 - 0.2 * i for i in range(23)]  # ~20 MiB/s
    decisions = await replay(guard, node, clock, leak[:20], step_s=10.0)
    assert decisions[-1].action is Action.warn and "memory leak trend" in decisions[-1].reason
    assert guard.trend is not None and guard.trend.plan_restart
    hooks.is_idle = True
    decisions = await replay(guard, node, clock, leak[20:], step_s=10.0)
    assert [d.action for d in decisions] == [Action.planned_restart, Action.warn, Action.warn]
    assert hooks.names() == ["restart"]


@pytest.mark.anyio
async def test_no_trend_while_starting(node: Node) -> None:
    """Startup allocation is not a leak: the window stays empty while vLLM starts."""
    hooks, clock = FakeHooks({4242}), FakeClock()
    hooks.is_starting = True
    guard = make_guard(node, hooks, clock)
    await replay(guard, node, clock, [100.0 - i for i in range(30)], step_s=10.0)
    assert guard.trend is None and guard.window.points == ()
    assert guard.interval == pytest.approx(guard.cfg.starting_interval_s)


@pytest.mark.anyio
async def test_snapshot_and_evidence_are_json(node: Node) -> None:
    """Status, metrics and incidents get plain values: memory figures, decision, counters, recent samples."""
    hooks, clock = FakeHooks({4242}), FakeClock()
    guard = make_guard(node, hooks, clock)
    await replay(guard, node, clock, [20.0, 7.0])
    snap = json.loads(json.dumps(guard.evidence()))
    assert snap["memory"]["available"] == 7 * GIB and snap["memory"]["driver_residual"] >= 0
    assert snap["decision"]["level"] == Level.ok.name and snap["counters"]["samples"] == 2
    assert [s["available"] for s in snap["recent_samples"]] == [20 * GIB, 7 * GIB]
    assert snap["psi"]["full_avg10"] == 0.0 and snap["kernel_log"] == []


@pytest.mark.anyio
async def test_run_loop_samples_until_cancelled(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """The real loop: starts, samples at the adaptive interval, acts, and stops when cancelled."""
    hooks = FakeHooks({victim.pid})
    cfg = config(node, max_interval_s=0.02, debounce_samples=2)
    guard = Guard(lambda: cfg, hooks)
    node.set(3.0)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(guard.run)
            while "stop" not in hooks.names():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert guard.counters.samples >= 2 and hooks.names() == ["evidence", "stop"]


@pytest.mark.anyio
async def test_run_loop_survives_a_bad_sample(node: Node, victim: subprocess.Popen[bytes]) -> None:
    """A source that stops making sense is logged and counted; the loop keeps guarding."""
    hooks = FakeHooks({victim.pid})
    cfg = config(node, max_interval_s=0.01)
    guard = Guard(lambda: cfg, hooks)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(guard.run)
            with open(node.meminfo, "r+") as handle:  # MemAvailable vanishes
                handle.truncate(0)
                handle.write("MemTotal: 1 kB\n")
            while guard.counters.sample_errors < 2:
                await anyio.sleep(0.01)
            node.set(3.0)
            while "stop" not in hooks.names():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_each_decision_is_logged_once_however_many_samples_repeat_it(node: Node) -> None:
    """The guard samples up to 200 times a second: only a change of decision reaches the log (and the daemon)."""
    hooks, clock = FakeHooks(set()), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1)
    with capture_logs() as logs:
        decisions = await replay(guard, node, clock, [1.0, 1.0, 1.0, 40.0, 40.0, 40.0])
    assert [d.action for d in decisions] == [Action.refuse_start] * 3 + [Action.ok] * 3
    said = [(e["action"], e["start_allowed"], e["log_level"]) for e in logs if e["event"] == "guard_decision"]
    assert said == [("refuse_start", False, "warning"), ("ok", True, "info")]
    assert [d.action for d in hooks.decisions] == [Action.refuse_start, Action.ok]


@pytest.mark.anyio
async def test_a_warning_decision_is_logged_as_a_warning_with_its_own_level_kept(node: Node) -> None:
    """journalctl -p warning shows the guard's warnings (issue 28): a decision above ok is a warning line, and the
    guard's level travels as guard_level (structlog's own `level` would overwrite a field called level)."""
    hooks, clock = FakeHooks(set()), FakeClock()
    guard = make_guard(node, hooks, clock, debounce_samples=1, refuse_start_below=7 * GIB)
    with capture_logs() as logs:
        decisions = await replay(guard, node, clock, [6.0])
    assert decisions[0].level is Level.warn
    (said,) = [e for e in logs if e["event"] == "guard_decision"]
    assert (said["log_level"], said["guard_level"]) == ("warning", "warn") and "level" not in said


@pytest.mark.anyio
async def test_after_step_gets_each_steps_sample_in_the_loops_wake_up(node: Node) -> None:
    """``after_step``: called right after each step of the loop with its sample (what the flight recorder records
    from, in the guard's own wake-up), None when that step could not read its sources."""
    cfg = config(node, max_interval_s=0.01)
    guard = Guard(lambda: cfg, FakeHooks(set()))
    node.set(20.0)
    seen: list[Sample | None] = []
    guard.after_step = seen.append
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            assert not guard.sampling
            await tg.start(guard.run)
            assert guard.sampling
            while not seen:
                await anyio.sleep(0.005)
            first = seen[0]
            assert first is not None and first.available == 20 * GIB
            with open(node.meminfo, "r+") as handle:  # MemAvailable vanishes
                handle.truncate(0)
                handle.write("MemTotal: 1 kB\n")
            while seen[-1] is not None:
                await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert not guard.sampling


@pytest.mark.parametrize(("level", "starting", "tree_known", "refresh"), [
    (Level.ok, False, True, PID_REFRESH_S),  # at rest: the listing is the idle loop's largest cost
    (Level.ok, True, True, PID_REFRESH_NEAR_S),  # vLLM starting: its tree grows
    (Level.ok, False, False, PID_REFRESH_NEAR_S),  # no tree known yet
    (Level.warn, False, True, PID_REFRESH_NEAR_S),  # near the floors: it may act
    (Level.kill, False, True, PID_REFRESH_NEAR_S),
])
def test_how_old_the_pid_list_may_be(level: Level, starting: bool, tree_known: bool, refresh: float) -> None:
    assert pid_refresh_s(level, starting=starting, tree_known=tree_known) == refresh
