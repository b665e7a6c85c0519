"""The daemon's effects over the real loop with fakes (tests/unit/loop_harness.py): an effect that raises, a
backoff shorter than the loop's tick, a preflight cut short by a stop, the instance record, a launch the runtime
cannot start, and vLLM's last lines arriving after its exit. Each kills a mutant in tests/MUTATION.md."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from loop_harness import config, running

from sparkd.commands import stop
from sparkd.daemon.effects.watching import NodeWatchReports
from sparkd.guard.kmsg import KernelLog
from sparkd.host.waits import Flag
from sparkd.launch.render import LaunchSpec
from sparkd.preflight.base import Check, CheckResult, PreflightContext, Verdict
from sparkd.runtime.base import Difference, ExitInfo, Instance, LaunchError
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio

TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
             "of 119.70 GiB of which 512.00 MiB is free.")


class RaisesOnce(FakeRuntime):
    """A runtime whose first launch, stop or drift check (preflight) raises what no runtime should (a bug)."""

    def __init__(self, effect: str) -> None:
        super().__init__()
        self.effect, self.raised = effect, False

    def _maybe_raise(self, effect: str) -> None:
        if self.effect == effect and not self.raised:
            self.raised = True
            raise RuntimeError(f"the {effect} broke")

    async def launch(self, spec: LaunchSpec) -> Instance:
        self._maybe_raise("launch")
        return await super().launch(spec)

    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        self._maybe_raise("stop")
        return await super().stop(instance, grace_s)

    async def drift(self) -> list[Difference]:
        self._maybe_raise("preflight")
        return await super().drift()


@pytest.mark.parametrize("effect", ["preflight", "launch", "stop"])
async def test_an_effect_that_raises_is_an_outcome_the_lifecycle_hears_and_recovers_from(tmp_path: Path,
                                                                                       effect: str) -> None:
    """Never a daemon stuck in preflight, starting or stopping because an effect raised instead of reporting."""
    runtime, clock = RaisesOnce(effect), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        if effect == "stop":
            await node.until_state("ready")
            runtime.crash()  # the stop that cleans up after the crash raises
        await node.until(lambda: node.status()["last_failure"] is not None and node.state == "ready")
        assert runtime.raised
        if effect != "stop":
            assert "could not carry out" in node.status()["last_failure"]["message"]


async def test_a_backoff_shorter_than_the_loops_tick_ends_on_time(tmp_path: Path) -> None:
    """The ticker wakes once a second; a new, nearer deadline re-arms it, so a 0.2 s backoff is 0.2 s."""
    cfg = config(tmp_path, restart={"backoff_initial_s": 0.2, "backoff_max_s": 0.2, "jitter": 0,
                                    "budget_failures": 99})
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        for _ in range(4):
            await node.crash_into("backoff")
            waited = await node.until(lambda: node.state != "backoff")
            assert waited == pytest.approx(0.2, abs=1e-6)


def slow_check(clock: FakeClock, seen: list[str]) -> Check:
    async def run(ctx: PreflightContext) -> CheckResult:
        try:
            await clock.sleep(1000)  # a page-cache drop or a sweep that takes its time
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        seen.append("finished")
        return CheckResult(Verdict.ok, "done at last")

    return Check("slow", run)


async def test_a_stop_during_preflight_cancels_the_running_checks(tmp_path: Path) -> None:
    runtime, clock, seen = FakeRuntime(), FakeClock(), []
    async with running(config(tmp_path), runtime, clock, checks=(slow_check(clock, seen),)) as node:
        assert node.state == "preflight"
        assert (await node.command(stop)).ok
        await node.settled()
        assert node.state == "stopped" and seen == ["cancelled"]
        clock.advance(2000)
        await node.settled()
        assert seen == ["cancelled"] and runtime.launches == []


async def test_the_instance_record_lives_as_long_as_the_instance(tmp_path: Path) -> None:
    """instance.json is what a restarted daemon adopts: it names the running instance, and nothing once stopped."""
    record = tmp_path / "state" / "instance.json"
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        await node.until(record.exists)
        assert str(node.status()["pid"]) in record.read_text()
        assert (await node.command(stop)).ok
        await node.until_state("stopped")
        with anyio.fail_after(10):  # real seconds: the file goes in a worker thread
            while record.exists():
                await anyio.sleep(0.01)


@pytest.mark.parametrize(("exit_code", "cls", "state"), [
    (127, "config_error", "failed"), (126, "config_error", "failed"), (1, "unknown", "backoff")])
async def test_a_launch_the_runtime_cannot_start(tmp_path: Path, exit_code: int, cls: str, state: str) -> None:
    """127 (not found) and 126 (not executable) will not fix themselves: the breaker opens at once."""
    runtime, clock = FakeRuntime(), FakeClock()
    runtime.launch_error = LaunchError("exec: vllm: not found", exit_code=exit_code)
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until(lambda: node.state in ("failed", "backoff"))
        assert node.state == state and node.status()["last_failure"]["class"] == cls


class LateLines(FakeRuntime):
    """The log follower lags the exit (inotify after the pidfd): the last lines arrive after the exit is seen."""

    async def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
        proc = self.procs[instance.pid]
        await proc.ended.wait()
        for _ in range(100):  # a lag in loop turns, not in (fake) time: no probe runs meanwhile
            await anyio.sleep(0)
        for line in proc.lines:
            yield line


async def test_the_exit_is_classified_with_the_lines_that_arrive_after_it(tmp_path: Path) -> None:
    runtime, clock = LateLines(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        assert runtime.current is not None
        runtime.current.lines.append(TORCH_OOM)
        runtime.crash(exit_code=1)
        await node.until(lambda: node.status()["last_failure"] is not None)
        assert node.status()["last_failure"]["class"] == "oom"


class PeerAway:
    """The group as the node sees it while a peer's sparkd does not answer."""

    def unreachable(self) -> list[str]:
        return ["10.0.0.2:8470"]

    async def head_stops_the_group(self) -> bool:
        return False


async def test_a_wedge_while_a_peers_sparkd_is_unreachable_is_the_peers_loss(tmp_path: Path) -> None:
    """The canary's timeout and the peer's grace race; the cause decides: the peer is lost (a wait, no budget),
    not a hang of vLLM (budget 1 would open the breaker)."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, restart={"budget_failures": 1}), runtime, clock) as node:
        await node.until_state("ready")
        daemon = node.daemon  # the watch's reports as the daemon builds them, over a group whose peer is away
        reports = NodeWatchReports(daemon.sup, daemon.launcher.output, daemon.launcher.evidence, group=PeerAway(),
                                   gpu=None)
        reports.post(v.HealthFailed(Failure.of(FailureClass.hang, "the canary got no answer")))
        await node.until(lambda: node.state in ("backoff", "failed"))
        failure = node.status()["last_failure"]
        assert node.state == "backoff" and failure["class"] == "peer_lost", failure
        assert "10.0.0.2:8470" in failure["message"]


class KernelOnly:
    """The guard as the failure evidence reads it: no memory sample yet, and the kernel log."""

    latest = None
    decision = None  # nothing decided: starts are allowed
    start_allowed = True

    def __init__(self, kernel: KernelLog) -> None:
        self.sampler = SimpleNamespace(kernel=kernel)

    def evidence(self) -> dict[str, Any]:
        return {}


XID_79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"


async def test_kernel_lines_from_before_a_launch_are_not_its_evidence(tmp_path: Path) -> None:
    """An Xid of an earlier launch must not make this launch's plain crash a GPU error; one during it does."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(f"3,1,100,-;{XID_79}\n")
    kernel = KernelLog.open(kmsg, from_start=True)
    assert kernel is not None and kernel.drain() and kernel.kept == 1
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, restart={"budget_failures": 99}), runtime, clock,
                       guard=KernelOnly(kernel)) as node:
        await node.until_state("ready")
        runtime.crash(exit_code=1)  # a relaunch: it starts after the Xid
        await node.until(lambda: node.state == "ready" and node.status()["launches"] == 2)
        runtime.crash(exit_code=1)
        await node.until(lambda: node.state == "ready" and node.status()["launches"] == 3)
        assert node.status()["last_failure"]["class"] == "unknown"
        with kmsg.open("a") as log:
            log.write(f"3,2,200,-;{XID_79}\n")
        kernel.drain()
        runtime.crash(exit_code=1)
        await node.until(lambda: node.state == "backoff")
        assert node.status()["last_failure"]["class"] == "gpu_error"
    kernel.close()
