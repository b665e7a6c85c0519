"""An identity's step-time history (sparkd.supervisor.stephistory): what it learns, the limit it gives, its JSON."""

from __future__ import annotations

import pytest

from sparkd.supervisor.stephistory import StepHistory, StepLimits, bucket, completed_steps, learn, limit_s
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

LIMITS = StepLimits(floor_s=5.0, margin=8.0, cap_s=300.0)


@pytest.mark.parametrize(("tokens", "expected"), [(-1, None), (0, 0), (1, 1), (3, 2), (4, 3), (8192, 14),
                                                  (32768, 16), (1 << 60, 40)])
def test_a_steps_bucket_is_the_bit_length_of_its_tokens(tokens: int, expected: int | None) -> None:
    assert bucket(tokens) == expected


@pytest.mark.parametrize(("history", "tokens", "limit"), [
    (StepHistory(), 3, 300.0),  # nothing seen: vLLM's own execute timeout
    (StepHistory({2: 0.05}), -1, 300.0),  # size unknown (an engine's step)
    (StepHistory({2: 0.05}), 3, 5.0),  # a decode step: the floor
    (StepHistory({2: 0.05, 14: 10.0}), 3, 5.0),  # a long chunk seen does not slow the decode's limit
    (StepHistory({2: 0.05, 14: 10.0}), 8192, 80.0),  # 8 x the longest of its size
    (StepHistory({2: 0.05, 14: 10.0}), 16384, 160.0),  # bigger than any seen: scaled by the tokens (x2)
    (StepHistory({2: 0.05}), 32768, 300.0),  # 0.05 s x 8192 x 8: capped
    (StepHistory({14: 1.0}), 3, 8.0),  # only bigger steps seen: no longer than the smallest of them
    (StepHistory({4: 0.2, 16: 51.4}), 16960, 300.0),  # a 1M prefill's last, shorter chunk: the full chunks bound it
    (StepHistory({4: 0.2, 12: 2.0, 15: 3.0, 16: 30.0}), 8192, 24.0),  # between sizes seen: the next bigger seen
])
def test_the_limit_of_a_step(history: StepHistory, tokens: int, limit: float) -> None:
    assert limit_s(history, tokens, LIMITS) == pytest.approx(limit)


def test_it_learns_the_longest_step_per_size_and_not_a_step_past_its_limit() -> None:
    h = learn(StepHistory(), [(0.02, 3), (0.05, 2), (0.01, -1), (0.0, 5)], LIMITS)
    assert h.longest == {2: 0.05} and h.learned == 2
    h = learn(h, [(0.04, 3)], LIMITS)
    assert h.longest == {2: 0.05} and h.learned == 3
    assert learn(h, [(5.1, 3)], LIMITS) == h  # a rank stopped 5 s and let go: past the 5 s floor, not learned
    assert learn(h, [(4.0, 3)], LIMITS).longest == {2: 4.0}
    assert learn(h, [(-1.0, 3)], LIMITS) is h


def test_what_a_reading_teaches_is_each_workers_last_and_longest_step() -> None:
    base = dict(rank=0, local_rank=0, world_size=1, pid=1, pid_ns=0, start_ticks=0, anchor_mono_ns=0,
                anchor_wall_ns=0, step=9, phase="idle", began_ns=1, ended_ns=2, tokens=3, held=-1, host="",
                boot_id="", title="", vllm="", note="")
    worker = StepRecord(role="worker", last_ns=2_000_000, last_tokens=3, longest_ns=50_000_000, longest_tokens=4,
                        **base)  # type: ignore[arg-type]
    engine = StepRecord(role="engine", last_ns=1_000_000, last_tokens=-1, longest_ns=60_000_000,
                        longest_tokens=-1, **base)  # type: ignore[arg-type]
    fresh = StepRecord(role="worker", last_ns=0, last_tokens=0, longest_ns=0, longest_tokens=0,
                       **base)  # type: ignore[arg-type]
    assert completed_steps([worker, engine, fresh]) == [(0.002, 3), (0.05, 4)]


def test_the_history_survives_json_and_a_bad_file_is_an_empty_history() -> None:
    h = StepHistory({2: 0.05, 14: 10.0}, learned=7)
    assert StepHistory.from_json(h.to_json()) == h
    for bad in (None, [], {"longest": 3}, {"longest": {"x": 1, "99": 1, "3": -1, "4": "a"}}):
        assert StepHistory.from_json(bad).longest == {}
    assert StepHistory.from_json({"longest": {"2": 1}, "learned": -3}) == StepHistory({2: 1.0})
