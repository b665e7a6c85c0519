"""Step files of real runs, replayed (tests/stepfixture.py): what sparkd's reader and rules made of the real vLLM 0.32
(tests/data/vllm-probe/, from the real-vLLM tier) and of the GPU host's NCCL ranks (tests/data/gpu/, from
tests/gpu/run_all.py) when they named a stopped process, made again from the files alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import stepfixture

from sparkd.host.stepfiles import read_steps
from sparkd.supervisor.stephistory import StepLimits
from sparkd.supervisor.steps import NodeSteps, judge_steps

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = [f for root in (DATA / "vllm-probe", DATA / "gpu") for f in stepfixture.folders(root)]


def test_the_real_runs_left_fixtures() -> None:
    assert any(f.parent.name == "vllm-probe" for f in FIXTURES), "tests/data/vllm-probe/ holds the tier's fixtures"


@pytest.mark.parametrize("folder", FIXTURES, ids=[f"{f.parent.name}/{f.name}" for f in FIXTURES])
def test_a_recorded_reading_gives_the_verdict_it_gave(folder: Path) -> None:
    data = stepfixture.load(folder)
    reading = read_steps(folder, now_ns=lambda: data["read_at_ns"])
    assert reading.problems == () and reading.records
    found = judge_steps([NodeSteps(data["node"], reading.read_at_ns, reading.records, 0.0, data["states"])],
                        data["history"], 0.0, StepLimits())
    expect = data["expect"]
    if expect is None:
        assert found is None
        return
    assert found is not None, reading
    got = {"class": found.cls.value, "role": found.view.record.role, "rank": found.view.record.rank,
           "pid": found.view.record.pid, "step": found.step}
    assert got == {k: expect[k] for k in got}
    assert seconds_out(found.failure().sentence) == seconds_out(expect["sentence"])


def seconds_out(sentence: str) -> str:
    """The sentence with its durations taken out (the recording added the reading's age, a few ms)."""
    return re.sub(r"\b\d+ s\b", "N s", sentence)
