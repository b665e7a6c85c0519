"""The step probe's sense (sparkd.daemon.watch.steps) and the instance's watch over it: this node's files read with
each process's state, a gone process's record dropped, a worker's answer to its head, a head's workers' readings on
its own clock, every rank's last records for an incident, the step history kept per identity; and the watch posting
the probe's verdict, through the log's first cause, with the canary's interval bounded."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from sparkd.config import Config, HealthConfig, config_from_mapping
from sparkd.daemon.watch.instance import InstanceWatch, Watched
from sparkd.daemon.watch.steps import SAVE_EVERY_S, StepSense
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.stephistory import StepHistory
from sparkd.supervisor.steps import NodeSteps
from sparkd.supervisor.stepwire import reading_json
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime
from sparkd.vllm_probe.sparkd_vllm_probe import layout
from sparkd.vllm_probe.sparkd_vllm_probe.writer import StepWriter

S = 1_000_000_000


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    warning = error = info


def config(tmp: Path, **health: Any) -> Config:
    return config_from_mapping({"runtime": "process", "node": {"name": "spark1"}, "launch": {"model": "m"},
                                "health": health,
                                "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run")}}, env={})


def sense_of(tmp: Path, *, workers: Any = None, **health: Any) -> tuple[StepSense, dict[Path, Mapping[str, Any]]]:
    saved: dict[Path, Mapping[str, Any]] = {}
    cfg = config(tmp, **health)
    (cfg.paths.run_dir / "probe").mkdir(parents=True)
    sense = StepSense(lambda: cfg, saved.__setitem__, FakeClock(start=50.0), Log(), image=lambda: "sha256:abc",
                      workers=workers)
    return sense, saved


def test_this_nodes_files_are_read_with_each_processs_state_and_a_gone_ones_dropped(tmp_path: Path) -> None:
    sense, _ = sense_of(tmp_path)
    probe = tmp_path / "run" / "probe"
    engine, worker = StepWriter(str(probe), layout.ENGINE, 0), StepWriter(str(probe), layout.WORKER, 0)
    worker.begin(8)
    gone = StepWriter(str(probe), layout.WORKER, 1)
    raw = bytearray((probe / "worker-1.step").read_bytes())
    layout.IDENTITY.pack_into(raw, layout.IDENTITY_AT, layout.WORKER, 1, 0, 1, 2**22 + 7, 0, 123, 0, 0, 0, 0, 0)
    gone.close()
    (probe / "worker-1.step").write_bytes(bytes(raw))  # a record of a process that no longer runs
    answer = sense.answer()
    assert answer["node"] == "spark1" and answer["read_at_ns"] > 0 and answer["problems"] == []
    assert [(r["role"], r["rank"], r["pid"]) for r in answer["records"]] == [("engine", 0, os.getpid()),
                                                                              ("worker", 0, os.getpid())]
    assert {(s["role"], s["rank"]) for s in answer["states"]} == {("engine", 0), ("worker", 0)}
    assert all(s["state"] in "RS" for s in answer["states"])
    engine.close()
    worker.close()


def test_a_node_with_the_probe_off_answers_so(tmp_path: Path) -> None:
    sense, _ = sense_of(tmp_path, step_probe=False)
    answer = sense.answer()
    assert answer["records"] == [] and answer["problems"] == ["the step probe is off ([health] step_probe)"]


@pytest.mark.anyio
async def test_a_head_reads_its_workers_on_its_own_clock_and_keeps_every_ranks_last_records(tmp_path: Path) -> None:
    remote = dataclasses.replace(
        _record(), rank=1, pid=4321, phase="step", step=12, began_ns=900 * S, ended_ns=899 * S, host="spark2")

    async def workers() -> list[tuple[str, dict[str, Any]]]:
        return [("10.0.0.2", reading_json("spark2", 942 * S, [remote], {("worker", 1): "T"}))]

    sense, _ = sense_of(tmp_path, workers=workers)
    writer = StepWriter(str(tmp_path / "run" / "probe"), layout.WORKER, 0)
    nodes = await sense.readings()
    assert [n.node for n in nodes] == ["spark1", "spark2"] and nodes[1].received_at == 50.0
    assert nodes[1].states == {("worker", 1): "T"}
    sense.clock.advance(3)  # type: ignore[attr-defined]
    text = sense.evidence()
    assert text is not None and f"rank 0 (worker) on spark1, PID {os.getpid()}: idle after step 0" in text
    assert "rank 1 (worker) on spark2, PID 4321, stopped (SIGSTOP): inside step 12 for 45.0 s" in text
    sense.forget()
    assert sense.evidence() is None
    writer.close()


def _record() -> Any:
    return layout.StepRecord(role="worker", rank=0, local_rank=0, world_size=2, pid=1, pid_ns=0, start_ticks=0,
                             anchor_mono_ns=0, anchor_wall_ns=0, step=0, phase="idle", began_ns=0, ended_ns=0,
                             tokens=-1, held=-1, last_ns=0, last_tokens=-1, longest_ns=0, longest_tokens=0, host="",
                             boot_id="", title="", vllm="", note="")


def test_the_history_is_kept_per_identity_at_most_once_a_minute(tmp_path: Path) -> None:
    sense, saved = sense_of(tmp_path)
    cfg = sense.config()
    identity = sense.identity(cfg)
    assert identity != StepSense(lambda: cfg, saved.__setitem__, sense.clock, Log(), image=lambda: None).identity(cfg)
    assert sense.load_history(identity) == StepHistory()
    learned = StepHistory({3: 0.05}, learned=4)
    sense.keep_history(identity, learned)
    assert saved == {}, "within a minute of the load: not yet"
    sense.clock.advance(SAVE_EVERY_S)  # type: ignore[attr-defined]
    sense.keep_history(identity, learned)
    path = tmp_path / "state" / "step-history" / f"{identity}.json"
    assert saved == {path: learned.to_json()} and path.parent.is_dir()
    more = StepHistory({3: 0.07}, learned=9)
    sense.keep_history(identity, more)
    assert saved[path] == learned.to_json(), "within the minute: not again"
    sense.keep_history(identity, more, now=True)
    assert saved[path] == more.to_json(), "the watch's end writes it"
    saved.clear()
    sense.keep_history(identity, more, now=True)
    assert saved == {}, "nothing new learned: nothing written"
    path.write_text(json.dumps(more.to_json()))
    assert sense.load_history(identity) == more


# ---- the instance's watch over the sense -------------------------------------------------------------------------


class Reports:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.posted = lines, []  # type: list[str], list[v.Observation]

    def post(self, obs: v.Observation) -> None:
        self.posted.append(obs)

    def state(self) -> v.State:  # type: ignore[name-defined]
        from sparkd.supervisor.states import State
        return State.ready

    def on_line(self, line: str, persist: bool = True) -> None:
        pass

    def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                      engine_gone: bool = False) -> Failure:
        return classify(exit_code, sig, self.lines, hint=hint)


class ScriptedSense:
    """Readings of two ranks: rank 1 inside step 9, rank 0 past it, from the second reading on."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.reads, self.kept = clock, 0, []  # type: FakeClock, int, list[StepHistory]

    async def readings(self) -> list[NodeSteps]:
        self.reads += 1
        now = self.clock.now()
        base = dataclasses.replace(_record(), step=9, longest_ns=S // 20, longest_tokens=3, tokens=3)
        ranks = (dataclasses.replace(base, rank=0, pid=10, ended_ns=int((now - 30) * S), began_ns=int((now - 31) * S)),
                 dataclasses.replace(base, rank=1, pid=11, phase="step", began_ns=int((now - 30) * S),
                                     ended_ns=int((now - 31) * S)))
        return [NodeSteps("a", int(now * S), ranks if self.reads > 1 else (), now)]

    def load_history(self, identity: str) -> StepHistory:
        return StepHistory({2: 0.05})

    def keep_history(self, identity: str, history: StepHistory, *, now: bool = False) -> None:
        self.kept.append(history)

    def forget(self) -> None:
        pass


@pytest.mark.anyio
async def test_the_watch_posts_the_probes_verdict_once_and_keeps_the_history() -> None:
    runtime, reports, clock = FakeRuntime(), Reports([]), FakeClock(start=0.0)
    sense = ScriptedSense(clock)
    watch = InstanceWatch(Watched(runtime.start(), steps=sense, step_identity="id"),  # type: ignore[arg-type]
                          runtime, reports, FakeProbes(runtime), HealthConfig, clock, Log())  # type: ignore[arg-type]
    watch._observe(lambda t, *_: (dataclasses.replace(t, verdict=type(t.verdict).healthy), None), None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch_steps, sense)
        await clock.run_until(lambda: bool(reports.posted) or sense.reads > 5)
        tg.cancel_scope.cancel()
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed) and posted.failure.cls is FailureClass.hang
    assert posted.failure.sentence.startswith("rank 1 (worker) on a, PID 11 has been inside step 9 for 30 s")
    assert watch.step_watch.seen and sense.kept


@pytest.mark.anyio
async def test_a_verdict_the_log_names_otherwise_is_the_logs() -> None:
    runtime, clock = FakeRuntime(), FakeClock(start=0.0)
    reports = Reports(["(EngineCore pid=1108) INFO 11-27 09:16:15 [core.py:1454] [shutdown] EngineCore: trigger "
                       "received signal=SIGTERM"])
    sense = ScriptedSense(clock)
    watch = InstanceWatch(Watched(runtime.start(), steps=sense, step_identity="id"),  # type: ignore[arg-type]
                          runtime, reports, FakeProbes(runtime), HealthConfig, clock, Log())  # type: ignore[arg-type]
    watch._observe(lambda t, *_: (dataclasses.replace(t, verdict=type(t.verdict).healthy), None), None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch._watch_steps, sense)
        await clock.run_until(lambda: bool(reports.posted) or sense.reads > 5)
        tg.cancel_scope.cancel()
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed) and posted.failure.cls is FailureClass.engine_dead
