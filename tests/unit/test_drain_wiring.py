"""Issue 36 in the daemon, over the real loop (tests/unit/loop_harness.py) and vLLM 0.32's own shutdown lines: every
stop sparkd chooses drains with the grace the launch's drain gives it, the status and the metrics show the drain with
the count in flight falling, `--now` skips it (and cuts a running one short), the guard's and a wedge's stops keep
their own graces, a vLLM that strands its clients is ended, a group's head stops its workers only once its own
requests are done, and a start's compile cache verdict and phases reach the status, the metrics and the incident."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from loop_harness import config, running

from sparkd.commands import restart as restart_command
from sparkd.commands import stop as stop_command
from sparkd.commands.act import NowRequest
from sparkd.commands.status import render
from sparkd.config import config_from_mapping
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.graces import StopKind, plan_for
from sparkd.supervisor.lifecycle import step
from sparkd.supervisor.readings import VllmMetrics
from sparkd.supervisor.states import Machine, State
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime

pytestmark = pytest.mark.anyio

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"
API = "(APIServer pid=29235) INFO 12-06 05:44:49 "
ENGINE = "(EngineCore pid=29592) INFO 12-06 05:44:49 "
START = API + "[launcher.py:270] [shutdown] API server: stopping engine client mode=drain timeout=120s"
DRAINING = ENGINE + "[core.py:1655] [shutdown] EngineCore: draining in-flight requests count=3 timeout=120s"
COMPLETE = ENGINE + "[core.py:1666] [shutdown] EngineCore: request processing complete; starting resource teardown"
STRANDED = "INFO:     Waiting for connections to close. (CTRL+C to force quit)"
W = "(Worker pid=20851) INFO 11-27 09:19:00 "
ENTRY = "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/6672fd1563decc2f39700095ad98a5f8/rank_0_0/model"
WARMUP = W + "[cpu_model_runner.py:87] Warming up model for the compilation..."
SAVED = W + f"[decorators.py:743] [backbone] saved AOT compiled function to {ENTRY}"
FAILED = ("(Worker pid=20851) WARNING 11-27 09:19:05 [decorators.py:333] [backbone] Compiling model again due to a "
          f"load failure from {ENTRY}, reason: 'function' object has no attribute 'finalize_loading'")
LOADED = W + f"[decorators.py:320] [backbone] Directly load AOT compilation from path {ENTRY}"


def metrics(running: float, waiting: float = 0.0) -> VllmMetrics:
    return VllmMetrics(num_requests_running=running, generation_tokens_total=100.0, num_requests_waiting=waiting)


class Scripted:
    """The probes of the runtime's instance, with /metrics as the test says."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self.probes = FakeProbes(runtime)

    def __call__(self) -> FakeProbes:
        return self.probes


async def serving(node: Any, runtime: FakeRuntime) -> int:
    await node.until_state("ready")
    assert runtime.current is not None
    runtime.current.drains = True
    return runtime.current.instance.pid


# ---- the plan, pure ---------------------------------------------------------------------------------------------


CFG = config_from_mapping({"runtime": "process", "launch": {"model": "m"},
                           "supervisor": {"stop_grace_s": 90, "hung_stop_grace_s": 5}}, source="test")


@pytest.mark.parametrize(("stop", "headless", "kind", "grace", "source"), [
    (v.Stop("operator stop"), False, StopKind.drain, 210.0, "drain_s 120 s + stop_grace_s 90 s"),
    (v.Stop("operator stop", now=True), False, StopKind.now, 90.0, "stop_grace_s: the stop skips the drain"),
    (v.Stop("operator stop"), True, StopKind.loading, 90.0, "stop_grace_s: vLLM does not serve yet"),
    (v.Stop("operator stop", serving=False), False, StopKind.loading, 90.0, "stop_grace_s: vLLM does not serve yet"),
    (v.Stop("health failed", failure=Failure.of(FailureClass.hang, "x")), False, StopKind.hung, 5.0,
     "hung_stop_grace_s: vLLM was wedged (hang)"),
    (v.Stop("health failed", failure=Failure.of(FailureClass.oom, "x"), hung=True), False, StopKind.hung, 5.0,
     "hung_stop_grace_s: its peer rank is gone"),
    (v.Stop("health failed", failure=Failure.of(FailureClass.oom, "x")), False, StopKind.failure, 90.0,
     "stop_grace_s: nothing left to finish"),
    (v.Stop("health failed", 7.0, Failure.of(FailureClass.killed_by_guard, "x")), False, StopKind.guard, 7.0,
     "the memory guard's stop_grace_s"),
])
def test_the_plan_of_each_stop_the_lifecycle_decides(stop: v.Stop, headless: bool, kind: StopKind, grace: float,
                                                     source: str) -> None:
    plan = plan_for(stop, CFG, launched_drain=120, headless=headless)
    assert (plan.kind, plan.grace_s, plan.source) == (kind, grace, source)


@pytest.mark.parametrize(("state", "obs", "actions"), [
    (State.ready, v.StopRequested(), [v.Stop("operator stop", serving=True)]),
    (State.ready, v.StopRequested(now=True), [v.Stop("operator stop", now=True, serving=True)]),
    (State.degraded, v.RestartRequested(now=True), [v.Stop("operator restart", now=True, serving=True)]),
    (State.starting, v.StopRequested(), [v.Stop("operator stop", serving=False)]),
    (State.stopping, v.StopRequested(now=True), [v.CutStop()]),
    (State.stopping, v.RestartRequested(now=True), [v.CutStop()]),
    (State.stopping, v.StopRequested(), []),
])
def test_now_rides_on_the_stop_and_cuts_one_running(state: State, obs: v.Observation,
                                                    actions: list[v.Action]) -> None:
    assert step(Machine(state=state), obs, 10.0).actions == actions


STEP_WEDGE = Failure(FailureClass.stall, "rank 0 has been inside step 532 for 5 s; sparkd restarts vLLM.", None, None,
                     "rank 0 (worker) on gpu-host, PID 691, stopped (SIGSTOP): inside step 532 for 5.4 s")


@pytest.mark.parametrize(("failure", "actions"), [
    (STEP_WEDGE, [v.CutStop("vLLM is wedged: rank 0 (worker) on gpu-host, PID 691, stopped (SIGSTOP): inside step "
                            "532 for 5.4 s")]),
    (Failure.of(FailureClass.hang, "no step begun for sparkd's canary"), [v.CutStop(
        "vLLM is wedged: no step begun for sparkd's canary")]),
    (Failure.of(FailureClass.engine_dead, "the engine core died"), []),
])
def test_a_wedge_named_while_a_stop_drains_cuts_the_drain(failure: Failure, actions: list[v.Action]) -> None:
    """Lifecycle rule 10: a wedged engine finishes none of its requests in flight; its drain would spend all of
    drain_s (the H100 run: a SIGSTOPped rank's `sparkctl stop` took 140 s)."""
    after = step(Machine(state=State.stopping), v.HealthFailed(failure), 10.0)
    assert after.actions == actions and after.machine.state is State.stopping


# ---- the daemon -------------------------------------------------------------------------------------------------


async def test_a_stop_drains_and_the_status_shows_the_count_falling(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    probes = Scripted(runtime)
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock, probes=probes) as node:
        pid = await serving(node, runtime)
        await stop_command.execute(node.daemon.control, NowRequest())
        runtime.say(START, DRAINING)
        await node.until(lambda: (node.status()["drain"] or {}).get("in_flight") == 3)
        probes.probes.metrics_value = metrics(running=1, waiting=1)
        await node.until(lambda: node.status()["drain"]["in_flight"] == 2)
        status = node.status()
        assert status["state"] == "stopping" and status["drain"]["state"] == "draining"
        assert status["drain"]["sentence"].startswith("draining: 2 in flight, ") and status["drain"]["left_s"] > 100
        assert "draining: 2 in flight" in render(status) and "--now` cuts it short" in render(status)
        assert node.daemon.view.line().startswith("stopping: draining: 2 in flight")
        told = [line for sent in node.notifier.sent for line in sent if line.startswith("STATUS=stopping: draining")]
        assert told and told[-1].startswith("STATUS=stopping: draining: 2 in flight"), "published as it moves"
        page = node.daemon.metrics.render().decode()
        assert 'sparkd_draining{node="scripted"} 1.0' in page
        assert 'sparkd_drain_requests_in_flight{node="scripted"} 2.0' in page
        steps = [h["drain"]["in_flight"] for h in status["history"] if h.get("phase") == "draining"]
        assert steps == [None, 3, 2], status["history"]
        runtime.say(COMPLETE)
        await node.until(lambda: node.status()["drain"]["state"] == "drained")
        runtime.finish()
        await node.until_state("stopped")
        await node.settled()
        assert runtime.stops == [(pid, 210.0)], "one SIGTERM with the drained grace: no SIGKILL"
        stop = node.status()["last_stop"]
        assert stop["kind"] == "drain" and not stop["sigkilled"] and stop["drain"].startswith("drained in ")
        assert node.status()["drain"] is None
        assert 'sparkd_draining{node="scripted"} 0.0' in node.daemon.metrics.render().decode()


async def draining_three(node: Any, runtime: FakeRuntime, command: Any) -> int:
    """vLLM serves, ``command`` (stop, restart) stops it, and its drain shows 3 requests in flight: its PID."""
    pid = await serving(node, runtime)
    await command.execute(node.daemon.control, NowRequest())
    runtime.say(START, DRAINING)
    await node.until(lambda: (node.status()["drain"] or {}).get("in_flight") == 3)
    return pid


async def test_stop_now_during_a_drain_cuts_it_short(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock) as node:
        pid = await draining_three(node, runtime, restart_command)
        await stop_command.execute(node.daemon.control, NowRequest(now=True))
        await node.until_state("stopped")
        await node.settled()
        assert runtime.stops == [(pid, 210.0), (pid, 0.0)]
        stop = node.status()["last_stop"]
        assert stop["sigkilled"] and stop["cut"] == "the operator's --now", stop
        assert "cut it short with SIGKILL" in stop["sentence"]
        assert node.status()["intent"] == "stop", "a stop during a restart's drain: stopped it stays"


async def test_the_drain_of_an_engine_found_wedged_is_cut(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock) as node:
        pid = await draining_three(node, runtime, stop_command)
        node.daemon.sup.post(v.HealthFailed(STEP_WEDGE))  # the step probe's verdict, read on while it drains
        await node.until_state("stopped")
        await node.settled()
        assert runtime.stops == [(pid, 210.0), (pid, 0.0)]
        stop = node.status()["last_stop"]
        assert stop["sigkilled"] and stop["cut"].startswith("vLLM is wedged: rank 0 (worker) on gpu-host"), stop
        assert stop["drain"].startswith("the drain was cut "), stop


@pytest.mark.parametrize(("running_now", "cut"), [(2.0, True), (0.0, False)])
async def test_restart_now_ends_vllm_at_once_only_with_requests_in_flight(tmp_path: Path, running_now: float,
                                                                          cut: bool) -> None:
    """vLLM launched with a drain ignores a second SIGTERM and cannot be told to abort: `--now` SIGKILLs it as soon
    as requests are in flight (their streams would hang otherwise), and lets an idle vLLM exit on its own."""
    runtime, clock = FakeRuntime(), FakeClock()
    probes = Scripted(runtime)
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock, probes=probes) as node:
        pid = await serving(node, runtime)
        probes.probes.metrics_value = metrics(running=running_now)
        await restart_command.execute(node.daemon.control, NowRequest(now=True))
        if not cut:
            await node.until(lambda: (node.status()["drain"] or {}).get("in_flight") == 0)
            runtime.say(START, COMPLETE)
            runtime.finish()
        await node.until(lambda: node.status()["launches"] == 2 and node.state == "ready")
        assert runtime.stops == ([(pid, 90.0), (pid, 0.0)] if cut else [(pid, 90.0)])
        stop = node.status()["last_stop"]
        assert stop["kind"] == "now" and stop["sigkilled"] is cut
        if cut:
            assert stop["cut"] == "the now stop skips the drain: 2 requests in flight"


async def test_the_stop_drains_with_the_drain_vllm_was_launched_with(tmp_path: Path) -> None:
    """A reload that lowers [stop] drain_s reaches vLLM with its next launch: the restart that relaunches still
    waits the drain the running vLLM has."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock) as node:
        pid = await serving(node, runtime)
        assert node.daemon.sup.instance().drain_s == 120  # type: ignore[union-attr]
        shorter = config(tmp_path, supervisor={"stop_grace_s": 90}, stop={"drain_s": 30})
        await node.daemon.sup.submit(v.ConfigReplaced(shorter))
        await restart_command.execute(node.daemon.control, NowRequest())
        await node.until(lambda: bool(runtime.stops))
        runtime.finish()
        await node.until(lambda: node.status()["launches"] == 2 and node.state == "ready")
        assert runtime.stops == [(pid, 210.0)]
        assert runtime.launches[-1].drain_s == 30 and node.daemon.sup.instance().drain_s == 30  # type: ignore[union-attr]


async def test_the_guards_stop_and_a_wedge_keep_their_graces_and_skip_the_drain(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    probes = Scripted(runtime)
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90, "hung_stop_grace_s": 4}), runtime, clock,
                       probes=probes) as node:
        pid = await serving(node, runtime)
        probes.probes.metrics_value = metrics(running=3)
        guard = Failure.of(FailureClass.killed_by_guard, "the node runs out of memory")
        node.daemon.sup.post(v.HealthFailed(guard, grace_s=30.0, recorded=True))
        await node.until_state("backoff")
        assert runtime.stops == [(pid, 30.0), (pid, 0.0)], "the guard's stop cuts the drain vLLM was launched with"
        assert node.status()["last_stop"]["kind"] == "guard"


async def test_a_vllm_that_strands_its_clients_is_ended(tmp_path: Path) -> None:
    """vLLM 0.32 launched without a drain aborts its requests and then waits for their clients for ever (the real
    tier's recording): the stop ends it as soon as it says so, not after the grace."""
    runtime, clock = FakeRuntime(), FakeClock()
    cfg = config(tmp_path, supervisor={"stop_grace_s": 90}, stop={"drain_s": 0})
    async with running(cfg, runtime, clock) as node:
        pid = await serving(node, runtime)
        await stop_command.execute(node.daemon.control, NowRequest())
        await node.until(lambda: bool(runtime.stops))
        abort = (DATA / "realvllm-032-drain-abort.log").read_text(encoding="utf-8").partition("\n---\n")[2]
        runtime.say(*abort.splitlines())
        await node.until_state("stopped")
        assert runtime.stops == [(pid, 90.0), (pid, 0.0)]
        stop = node.status()["last_stop"]
        assert stop["sigkilled"] and stop["cut"].startswith("vLLM stranded after "), stop
        assert stop["drain"] is None, "no drain: vLLM was launched without one"


class Workers:
    """A group's head as its Node sees the group: the workers' stop, and what the head's drain was then."""

    role: Any = None

    def __init__(self, node: Any) -> None:
        from sparkd.config import Role

        self.role = Role.head
        self.node = node
        self.drain_when_stopped: list[Any] = []

    async def stop_workers(self) -> None:
        drain = self.node.daemon.sup.node().drain
        self.drain_when_stopped.append(None if drain is None else drain.state.value)


async def test_a_groups_head_stops_its_workers_only_once_its_requests_are_done(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock) as node:
        await serving(node, runtime)
        workers = Workers(node)
        node.daemon.node.group = workers  # type: ignore[assignment]
        await stop_command.execute(node.daemon.control, NowRequest())
        runtime.say(START, DRAINING)
        await node.until(lambda: (node.status()["drain"] or {}).get("in_flight") == 3)
        later = clock.now() + 30
        await node.until(lambda: clock.now() >= later)
        assert workers.drain_when_stopped == [], "the head's engine still drains: its workers run on"
        runtime.say(COMPLETE)
        await node.until(lambda: bool(workers.drain_when_stopped))
        assert workers.drain_when_stopped == ["drained"]
        runtime.finish()
        await node.until_state("stopped")
        # a wedge: the workers at once, as before (the head's rank spins in a collective its peer left)
        await node.command(__import__("sparkd.commands.start", fromlist=["x"]))
        await serving(node, runtime)
        node.daemon.sup.post(v.HealthFailed(Failure.of(FailureClass.hang, "wedged")))
        await node.until(lambda: len(workers.drain_when_stopped) == 2)
        assert runtime.current is not None and runtime.current.exit is None, "before the head's own rank ended"


# ---- a start: its phases and its compile cache --------------------------------------------------------------------


async def test_the_compile_cache_verdict_is_kept_and_a_miss_where_a_hit_was_due_is_a_warning(
        tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("starting")
        runtime.say(WARMUP)
        await node.settled()
        clock.advance(13)
        runtime.say(SAVED)
        await node.settled()
        runtime.serve()
        await node.until_state("ready")
        await node.settled()
        timing = node.status()["start_timing"]
        assert timing["compile_cache"]["verdict"] == "miss" and timing["compile_cache"]["explained"] == "first start"
        assert "start: compile cache miss (first start), 13 s" in render(node.status())
        memory = tmp_path / "state" / "compile-cache.json"
        with anyio.fail_after(10):  # written off the loop, in a worker thread
            while not memory.exists():
                await anyio.sleep(0.01)
        remembered = json.loads(memory.read_text())
        assert remembered["stored"] and remembered["key"] == "6672fd1563decc2f39700095ad98a5f8"

        await restart_command.execute(node.daemon.control, NowRequest())
        await node.until(lambda: node.status()["launches"] == 2 and node.state == "starting")
        runtime.say(WARMUP, FAILED)
        await node.until(lambda: (node.status()["start_timing"]["compile_cache"] or {}).get("verdict") == "miss")
        cache = node.status()["start_timing"]["compile_cache"]
        assert cache["expected"] and cache["unexpected_miss"]
        assert "where a hit was expected" in cache["sentence"]
        page = node.daemon.metrics.render().decode()
        assert 'sparkd_compile_cache_unexpected_miss{node="scripted"} 1.0' in page
        assert 'sparkd_compile_cache_hit{node="scripted"} 0.0' in page

        await restart_command.execute(node.daemon.control, NowRequest())
        await node.until(lambda: node.status()["launches"] == 3 and node.state == "starting")
        runtime.say(WARMUP, LOADED)
        await node.settled()
        runtime.serve()
        await node.until_state("ready")
        assert node.status()["start_timing"]["compile_cache"]["sentence"] == "compile cache hit, 0 s"
        assert 'sparkd_compile_cache_hit{node="scripted"} 1.0' in node.daemon.metrics.render().decode()


async def test_the_incident_of_a_failed_start_says_where_its_time_went(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("starting")
        clock.advance(7)
        runtime.say("(EngineCore pid=9) INFO 11-27 09:19:00 [gpu_model_runner.py:2200] Starting to load model m...")
        await node.settled()
        clock.advance(5)
        runtime.crash(1)
        await node.until_state("backoff")
        await node.settled()
        (incident,) = (tmp_path / "state" / "incidents").iterdir()
        timing = json.loads((incident / "incident.json").read_text())["start_timing"]
        assert timing["phases_s"]["launching"] == 7.0 and timing["phases_s"]["loading_weights"] >= 5.0, timing
        assert timing["vllm_start_s"] is None


async def test_a_head_whose_vllm_logs_no_shutdown_step_goes_by_its_gauges(tmp_path: Path) -> None:
    """A vLLM older than 0.24 drains without a word: once its gauges say nothing is in flight, the workers go."""
    runtime, clock = FakeRuntime(), FakeClock()
    probes = Scripted(runtime)
    async with running(config(tmp_path, supervisor={"stop_grace_s": 90}), runtime, clock, probes=probes) as node:
        await serving(node, runtime)
        workers = Workers(node)
        node.daemon.node.group = workers  # type: ignore[assignment]
        probes.probes.metrics_value = metrics(running=2)
        began = clock.now()
        await stop_command.execute(node.daemon.control, NowRequest())
        await node.until(lambda: clock.now() >= began + 20)
        assert workers.drain_when_stopped == [], "two requests in flight"
        probes.probes.metrics_value = metrics(running=0)
        await node.until(lambda: bool(workers.drain_when_stopped))
        assert workers.drain_when_stopped == ["draining"] and clock.now() < began + 30
        runtime.finish()
        await node.until_state("stopped")


def test_restart_wait_shows_the_drain_as_progress() -> None:
    from sparkd.cli.progress import describe_step, live_text

    drain = {"state": "draining", "in_flight": 3, "left_s": 97.0, "sentence": "draining: 3 in flight, 97 s left"}
    entry = {"at": 0.0, "state": "stopping", "phase": "draining", "drain": drain}
    assert describe_step(entry) == "stopping: draining: 3 in flight, 97 s left"
    assert live_text("ready", {"state": "stopping", "drain": drain}, 4.0).startswith(
        "stopping: draining: 3 in flight, 97 s left   00:04 elapsed")
