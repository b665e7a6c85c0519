"""The step probe's sense (sparkd.daemon.watch.steps): this node's files read with each process's state, a gone
process's record dropped, a worker's answer to its head, a head's workers' readings on its own clock, every rank's
last records for an incident, the step history kept per identity."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.daemon.watch.steps import SAVE_EVERY_S, StepSense
from sparkd.supervisor.stephistory import StepHistory
from sparkd.supervisor.stepwire import reading_json
from sparkd.testing import FakeClock
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


def _proc_entry(proc: Path, state: str, start: int, *, nspid: str = "5000\t7", status: bool = True) -> None:
    """A fake /proc's host PID 5000 (by default PID 7 in its container), in ``state``, started at ``start``."""
    (proc / "5000").mkdir(parents=True, exist_ok=True)
    (proc / "5000" / "stat").write_text(f"5000 (VLLM::Worker) {state} " + " ".join(["0"] * 18) + f" {start} 0 0\n")
    if status:
        (proc / "5000" / "status").write_text(f"Name:\tVLLM::Worker\nNSpid:\t{nspid}\n")


def _containers_rank(tmp: Path, proc: Path) -> StepSense:
    """A sense over ``proc`` whose one step file is worker 0's, written as PID 7 of a container started at 123."""
    sense, _ = sense_of(tmp)
    sense.proc = proc
    probe = tmp / "run" / "probe"
    writer = StepWriter(str(probe), layout.WORKER, 0)
    raw = bytearray((probe / "worker-0.step").read_bytes())
    layout.IDENTITY.pack_into(raw, layout.IDENTITY_AT, layout.WORKER, 0, 0, 1, 7, 4026532000, 123, 0, 0, 0, 0, 0)
    writer.close()
    (probe / "worker-0.step").write_bytes(bytes(raw))
    return sense

def test_a_containers_rank_is_named_by_the_pid_the_host_sees(tmp_path: Path) -> None:
    """A rank in a container writes the PID of its own namespace (7); sparkd finds the process whose innermost NSpid
    and start time are the record's (host PID 5000) and names that one."""
    proc = tmp_path / "proc"
    _proc_entry(proc, "T", 123)
    sense = _containers_rank(tmp_path, proc)
    answer = sense.answer()
    assert [r["pid"] for r in answer["records"]] == [5000]
    assert answer["states"] == [{"role": "worker", "rank": 0, "state": "T"}]


def test_a_process_found_before_is_confirmed_by_its_stat_alone_and_a_reused_pid_is_looked_for_again(
        tmp_path: Path) -> None:
    """Read every few seconds while vLLM serves: once a rank's process is found (its NSpid in ``status``), a reading
    confirms it by its start time in ``stat`` (one small read, no ``status``), and reads its state from the same
    line; a PID whose start time changed is another process, and the record's is looked for again."""
    proc = tmp_path / "proc"
    _proc_entry(proc, "S", 123)
    sense = _containers_rank(tmp_path, proc)
    assert [r["pid"] for r in sense.answer()["records"]] == [5000]
    (proc / "5000" / "status").unlink()  # a reading that read it again would find no process
    _proc_entry(proc, "T", 123, status=False)
    answer = sense.answer()
    assert [r["pid"] for r in answer["records"]] == [5000]
    assert answer["states"] == [{"role": "worker", "rank": 0, "state": "T"}]
    _proc_entry(proc, "S", 999, nspid="5000")  # PID 5000 is another process now
    assert sense.answer()["records"] == []


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
