"""A node's step reading on the peer link (sparkd.supervisor.stepwire): what a worker sends, and what its head takes
of it — a peer's claim, each bad record dropped and named, texts bounded, the reading stamped on the head's clock."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sparkd.supervisor.stepwire import MAX_TEXT, node_steps, reading_json
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

RECORD = StepRecord(role="worker", rank=1, local_rank=0, world_size=2, pid=4321, pid_ns=4026531836, start_ticks=99,
                    anchor_mono_ns=5, anchor_wall_ns=6, step=48213, phase="step", began_ns=10**12, ended_ns=10**12 - 1,
                    tokens=3, held=-1, last_ns=0, last_tokens=-1, longest_ns=50_000_000, longest_tokens=3,
                    host="spark1", boot_id="b", title="VLLM::Worker_TP1", vllm="0.32.0", note="")


def test_a_reading_crosses_the_link_whole() -> None:
    sent = json.loads(json.dumps(reading_json("spark1", 2 * 10**12, [RECORD], {("worker", 1): "T"}, ["x.step: torn"])))
    steps, problems = node_steps(sent, peer="10.0.0.2", received_at=77.5)
    assert steps.node == "spark1" and steps.read_at_ns == 2 * 10**12 and steps.received_at == 77.5
    assert steps.records == (RECORD,) and steps.states == {("worker", 1): "T"}
    assert problems == ["10.0.0.2: x.step: torn"]


def wire_of(**changes: Any) -> dict[str, Any]:
    record = dataclasses.asdict(RECORD)
    record.update(changes)
    return {"node": "spark1", "read_at_ns": 1, "records": [record], "states": [], "problems": []}


@pytest.mark.parametrize("changes", [{"pid": "4321"}, {"step": True}, {"step": 1.5}, {"role": "api"},
                                     {"phase": "sleeping"}, {"note": None}, {"step": 1 << 64}])
def test_a_record_that_is_not_a_step_record_is_dropped_and_named(changes: dict[str, Any]) -> None:
    steps, problems = node_steps(wire_of(**changes), peer="10.0.0.2", received_at=1.0)
    assert steps.records == () and problems == ["10.0.0.2: record 0 is not a step record"]


def test_a_record_with_a_field_more_or_less_is_dropped() -> None:
    more = wire_of()
    more["records"][0]["extra"] = 1
    less = wire_of()
    del less["records"][0]["note"]
    for answer in (more, less):
        assert node_steps(answer, peer="p", received_at=1.0)[0].records == ()


def test_texts_are_one_bounded_line_and_a_missing_node_is_the_peer() -> None:
    answer = wire_of(title="x\n" * 500)
    del answer["node"]
    steps, _ = node_steps(answer, peer="10.0.0.2", received_at=1.0)
    assert steps.node == "10.0.0.2" and len(steps.records[0].title) == MAX_TEXT and "\n" not in steps.records[0].title


@pytest.mark.parametrize("answer", [{}, {"read_at_ns": "soon"}, [], {"read_at_ns": 1, "records": "many"}])
def test_an_answer_that_is_no_reading_gives_no_records(answer: Any) -> None:
    steps, _ = node_steps(answer if isinstance(answer, dict) else {}, peer="p", received_at=1.0)
    assert steps.records == ()
