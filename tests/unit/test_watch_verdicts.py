"""A wedge verdict meets vLLM's log: an engine whose death vLLM logged (an outside SIGTERM to the engine core) answers
no canary for the seconds vLLM takes to notice, and that is its death, not a wedge; a wedge with no such line stays
one. The step probe's verdicts (issue 38) go the same way: the watch reads every rank's records once a second,
posts the probe's verdict once, and keeps the identity's history."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from sparkd.config import HealthConfig
from sparkd.daemon.watch import instance as instance_module
from sparkd.daemon.watch.instance import InstanceWatch, Watched
from sparkd.supervisor import health
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import HealthTracker, Verdict
from sparkd.supervisor.states import State
from sparkd.supervisor.stephistory import StepHistory
from sparkd.supervisor.steps import NodeSteps
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

SIGTERMED = ["(EngineCore pid=1108) INFO 11-27 09:16:15 [core.py:1454] [shutdown] EngineCore: trigger received "
             "signal=SIGTERM"]
QUIET = ["(APIServer pid=780) INFO 11-27 09:10:23 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s"]


class Reports:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.posted = lines, []  # type: list[str], list[v.Observation]

    def post(self, obs: v.Observation) -> None:
        self.posted.append(obs)

    def state(self) -> State:
        return State.ready

    def on_line(self, line: str, persist: bool = True) -> None:
        pass

    async def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                            engine_gone: bool = False) -> Failure:
        return classify(exit_code, sig, self.lines, hint=hint)

    async def head_stops_the_group(self) -> bool:
        return False


class Log:
    def info(self, *args: Any, **kwargs: Any) -> None:
        pass

    warning = info


async def verdict(cls: FailureClass, lines: list[str]) -> Failure:
    """What the watch posts when the tracker calls ``cls`` with ``lines`` in vLLM's log."""
    runtime, reports = FakeRuntime(), Reports(lines)
    watch = InstanceWatch(Watched(runtime.start()), runtime, reports, FakeProbes(runtime),  # type: ignore[arg-type]
                          HealthConfig, FakeClock(start=0.0), Log())
    called = Failure(cls=cls, sentence="the tracker's sentence; sparkd restarts.", exit_code=None, signal=None,
                     evidence="canary unanswered")
    await watch._observe(lambda t, *_: (t, v.HealthFailed(called)), None)
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed)
    assert isinstance(watch.health, HealthTracker)
    return posted.failure


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [FailureClass.hang, FailureClass.stall])
async def test_a_logged_death_is_no_wedge(cls: FailureClass) -> None:
    failure = await verdict(cls, SIGTERMED)
    assert failure.cls is FailureClass.engine_dead and "received SIGTERM from outside sparkd" in failure.sentence


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [FailureClass.hang, FailureClass.stall])
async def test_a_wedge_without_such_a_line_stays_one(cls: FailureClass) -> None:
    failure = await verdict(cls, QUIET)
    assert failure.cls is cls and failure.sentence.startswith("the tracker's sentence")


# ---- the step probe's verdicts -----------------------------------------------------------------------------------

S = 1_000_000_000
RANK = StepRecord(role="worker", rank=0, local_rank=0, world_size=2, pid=10, pid_ns=0, start_ticks=0, anchor_mono_ns=0,
                  anchor_wall_ns=0, step=9, phase="idle", began_ns=0, ended_ns=0, tokens=3, held=-1, last_ns=0,
                  last_tokens=-1, longest_ns=S // 20, longest_tokens=3, host="a", boot_id="", title="", vllm="",
                  note="")


class ScriptedSense:
    """Readings of two ranks, from the second reading on: rank 1 inside step 9 for 30 s, rank 0 past it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.reads, self.kept = clock, 0, []  # type: FakeClock, int, list[StepHistory]

    async def readings(self) -> list[NodeSteps]:
        self.reads += 1
        now = self.clock.now()
        ranks = (dataclasses.replace(RANK, ended_ns=int((now - 30) * S), began_ns=int((now - 31) * S)),
                 dataclasses.replace(RANK, rank=1, pid=11, phase="step", began_ns=int((now - 30) * S),
                                     ended_ns=int((now - 31) * S)))
        return [NodeSteps("a", int(now * S), ranks if self.reads > 1 else (), now)]

    def load_history(self, identity: str) -> StepHistory:
        return StepHistory({2: 0.05})

    def keep_history(self, identity: str, history: StepHistory, *, now: bool = False) -> None:
        self.kept.append(history)

    def forget(self) -> None:
        pass


async def probed(lines: list[str]) -> tuple[Failure, InstanceWatch, ScriptedSense]:
    """What the watch posts when its step probe's readings name rank 1, with ``lines`` in vLLM's log."""
    runtime, reports, clock = FakeRuntime(), Reports(lines), FakeClock(start=0.0)
    sense = ScriptedSense(clock)
    watch = InstanceWatch(Watched(runtime.start(), steps=sense, step_identity="id"),  # type: ignore[arg-type]
                          runtime, reports, FakeProbes(runtime), HealthConfig, clock, Log())  # type: ignore[arg-type]
    watch.health = dataclasses.replace(watch.health, verdict=Verdict.healthy)  # vLLM serves
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch_steps, sense)
        await clock.run_until(lambda: bool(reports.posted) or sense.reads > 5)
        tg.cancel_scope.cancel()
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed)
    return posted.failure, watch, sense


@pytest.mark.anyio
async def test_the_watch_posts_the_probes_verdict_once_and_keeps_the_history() -> None:
    failure, watch, sense = await probed(QUIET)
    assert failure.cls is FailureClass.hang
    assert failure.sentence.startswith("rank 1 (worker) on a, PID 11 has been inside step 9 for 30 s")
    assert watch.step_watch.seen and sense.kept


@pytest.mark.anyio
async def test_a_probes_verdict_the_log_names_otherwise_is_the_logs() -> None:
    failure, _, _ = await probed(SIGTERMED)
    assert failure.cls is FailureClass.engine_dead and "received SIGTERM from outside sparkd" in failure.sentence


class Unanswered(FakeProbes):
    """A canary the engine never answers."""

    async def canary(self) -> Any:
        await anyio.sleep_forever()


class IdleEngine(ScriptedSense):
    """An engine core idle since long before: it begins no step for whatever request arrives."""

    async def readings(self) -> list[NodeSteps]:
        self.reads += 1
        now = self.clock.now()
        engine = dataclasses.replace(RANK, role="engine", tokens=-1, held=0, began_ns=int((now - 101) * S),
                                     ended_ns=int((now - 100) * S))
        return [NodeSteps("a", int(now * S), (engine,), now)]


@pytest.mark.anyio
async def test_an_engine_that_begins_no_step_for_sparkds_canary_is_named() -> None:
    """The canary in flight is the request the probe's rules know waits; while the probe reads the ranks the canary
    runs at least every 8 s (its first one waits the configured 15 s: nothing was read yet)."""
    from sparkd.supervisor.signals.canary import CANARY

    runtime, reports, clock = FakeRuntime(), Reports(QUIET), FakeClock(start=0.0)
    sense = IdleEngine(clock)
    watch = InstanceWatch(Watched(runtime.start(), steps=sense, step_identity="id"),  # type: ignore[arg-type]
                          runtime, reports, Unanswered(runtime), lambda: HealthConfig(canary_interval_s=15),
                          clock, Log())  # type: ignore[arg-type]
    watch.health = dataclasses.replace(watch.health, verdict=Verdict.healthy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch_steps, sense)
        tg.start_soon(watch._run_signal, CANARY)
        await clock.run_until(lambda: bool(reports.posted) or clock.now() > 60)
        tg.cancel_scope.cancel()
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed) and posted.failure.cls is FailureClass.stall
    assert posted.failure.sentence.startswith("a test generation sparkd sent is unanswered, and the engine core")
    assert 20 <= clock.now() <= 22, clock.now()  # sent at 15 s, named 5 s later (a reading a second)


class CountingReports(Reports):
    def __init__(self) -> None:
        super().__init__(QUIET)
        self.asked = 0

    def state(self) -> State:
        self.asked += 1  # once a wake-up of the step watch
        return State.ready


class Unhurried(FakeProbes):
    """A canary answered after 2 s on ``clock``."""

    def __init__(self, runtime: FakeRuntime, clock: FakeClock) -> None:
        super().__init__(runtime)
        self.clock = clock

    async def canary(self) -> Any:
        await self.clock.sleep(2.0)
        return await super().canary()


@pytest.mark.anyio
async def test_at_rest_the_step_watch_wakes_only_for_its_reads_and_sparkds_canary() -> None:
    """Issue 35: every rank rests, so the files are read every 5 s, and the watch sleeps in between rather than waking
    each second to find nothing due; a canary sent wakes it at once and it reads every second while the canary waits."""
    from sparkd.supervisor.signals.canary import CANARY

    runtime, reports, clock = FakeRuntime(), CountingReports(), FakeClock(start=0.0)
    sense = IdleEngine(clock)
    probes = Unhurried(runtime, clock)
    watch = InstanceWatch(Watched(runtime.start(), steps=sense, step_identity="id"),  # type: ignore[arg-type]
                          runtime, reports, probes, lambda: HealthConfig(canary_interval_s=15),
                          clock, Log())  # type: ignore[arg-type]
    watch.health = dataclasses.replace(watch.health, verdict=Verdict.healthy)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch_steps, sense)
        await clock.run_until(lambda: sense.reads == 3)
        assert clock.now() == 11 and reports.asked == 3, (clock.now(), reports.asked)  # woke at 1, 6, 11 s only
        tg.start_soon(watch._run_signal, CANARY)  # the probe has read: its canary goes out every 8 s, first at 19 s
        await clock.run_until(lambda: sense.reads == 5)
        assert clock.now() == 19, clock.now()  # the resting read at 16 s, then woken by the canary (not at 21 s)
        await clock.run_until(lambda: sense.reads == 6)
        assert clock.now() == 20, clock.now()  # a read a second while it waits
        tg.cancel_scope.cancel()
    assert not reports.posted


# ---- other clients' connections: counted at every round only while a wedge could be named (issue 35) -------------

def test_the_clients_are_counted_every_round_only_while_a_wedge_could_be_named() -> None:
    t = HealthTracker()
    busy = dataclasses.replace(t, clock=dataclasses.replace(t.clock, running=2))
    unanswered = dataclasses.replace(t, clock=dataclasses.replace(t.clock, canary_sent_at=90.0))
    assert health.clients_due(t, 100.0, None, None)  # never counted
    assert not health.clients_due(t, 100.0, 95.0, None)  # at rest: every CLIENTS_AT_REST_S
    assert health.clients_due(t, 100.0, 100.0 - health.CLIENTS_AT_REST_S, None)
    assert not health.clients_due(t, 100.0, 95.0, 99.5)  # a canary out a moment: an answer is on its way
    assert health.clients_due(t, 100.0, 95.0, 100.0 - health.CANARY_SLOW_S)  # a slow canary: a wedge may come
    assert health.clients_due(busy, 100.0, 95.0, None)  # requests running: a stall may come
    assert health.clients_due(unanswered, 100.0, 95.0, None)  # a canary timed out
    seen = dataclasses.replace(t, clients=1)
    assert health.clients_due(seen, 100.0, 95.0, None)  # clients seen: counted until they leave (the replay waits)
    assert not health.clients_due(dataclasses.replace(t, clients=0), 100.0, 95.0, None)


@pytest.mark.anyio
async def test_at_rest_the_health_round_counts_the_clients_every_30_s_not_every_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[float] = []
    runtime, reports, clock = FakeRuntime(), Reports(QUIET), FakeClock(start=0.0)
    monkeypatch.setattr(instance_module, "open_clients", lambda port, families: counted.append(clock.now()) or 0)
    watch = InstanceWatch(Watched(runtime.start(), clients_port=8000), runtime, reports,  # type: ignore[arg-type]
                          FakeProbes(runtime), lambda: HealthConfig(interval_s=5), clock, Log())  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._probe_health)
        await clock.run_until(lambda: clock.now() >= 64)
        tg.cancel_scope.cancel()
    assert counted == [0.0, 30.0, 60.0], counted  # thirteen health rounds, three counts
    assert watch.health.clients == 0


class WorkerReports(Reports):
    """A headless rank's: its head's sparkd stops the group, or not."""

    def __init__(self, lines: list[str], *, head_stops: bool) -> None:
        super().__init__(lines)
        self.head_stops, self.asked = head_stops, 0

    async def head_stops_the_group(self) -> bool:
        self.asked += 1
        return self.head_stops


STORE_GONE = ["(Worker pid=90) [W1207 00:55:30 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=9): "
              "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"]
OWN_DEATH = ["(Worker pid=90) RuntimeError: CUDA error: an illegal memory access was encountered"]


async def headless_rank(reports: WorkerReports, *, say: list[str], exit_code: int | None) -> list[v.Observation]:
    """What the watch of a headless rank posts when it logs ``say`` (then exits with ``exit_code``, if not None)."""
    runtime = FakeRuntime()
    watch = InstanceWatch(Watched(runtime.start()), runtime, reports, None, HealthConfig,  # type: ignore[arg-type]
                          FakeClock(start=0.0), Log())
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        runtime.say(*say)
        if exit_code is not None:
            runtime.crash(exit_code)
        with anyio.fail_after(10):
            while not reports.posted:
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    return reports.posted


@pytest.mark.anyio
async def test_a_worker_that_loses_its_head_to_the_heads_stop_stops_without_a_failure() -> None:
    """The head's rank ends the moment its requests are done, before its order reaches the worker: the worker's rank
    logs torch's TCPStore loss first. Asked then, the head says it stops the group: stopped as its order would."""
    stopping = WorkerReports(STORE_GONE, head_stops=True)
    assert await headless_rank(stopping, say=STORE_GONE * 3, exit_code=None) == [v.StopRequested()]
    assert stopping.asked == 1  # once per watch, not per line
    lost = WorkerReports(STORE_GONE, head_stops=False)  # the head's sparkd serves on, or does not answer
    (posted,) = await headless_rank(lost, say=STORE_GONE, exit_code=None)
    assert isinstance(posted, v.HealthFailed) and posted.failure.cls is FailureClass.peer_lost


@pytest.mark.anyio
async def test_a_worker_ranks_own_death_is_a_failure_whatever_the_head_does() -> None:
    by_loss = WorkerReports(STORE_GONE, head_stops=True)  # its exit read as the head's loss
    assert await headless_rank(by_loss, say=[], exit_code=1) == [v.StopRequested()]
    own = WorkerReports(OWN_DEATH, head_stops=True)
    (posted,) = await headless_rank(own, say=OWN_DEATH, exit_code=1)
    assert isinstance(posted, v.Exited) and posted.failure.cls is not FailureClass.peer_lost
    assert own.asked == 0  # a rank's own death is never asked about
