"""Speculative decoding and numerics over two /metrics scrapes (sparkd/supervisor/acceptance/counters.py), on vLLM
0.32's own pages (tests/data/acceptance/) and on pages cut to the case."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.supervisor.acceptance.counters import Counters, judge_numerics, judge_spec_decode, read_counters

DATA = Path(__file__).parents[1] / "data"


def page(drafts: float, per_pos: list[float], corrupted: float | None = None, engines: int = 1) -> str:
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter"]
    for e in range(engines):
        lines.append(f'vllm:spec_decode_num_drafts_total{{engine="{e}",model_name="m"}} {drafts}')
        lines.append(f'vllm:spec_decode_num_drafts_created{{engine="{e}",model_name="m"}} 1.7e9')
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{p}"}} '
                  f'{n}' for p, n in enumerate(per_pos)]
        if corrupted is not None:
            lines.append(f'vllm:corrupted_requests_total{{engine="{e}",model_name="m"}} {corrupted}')
    return "\n".join(lines) + "\n"


def test_counters_are_summed_over_engines() -> None:
    counters = read_counters(page(5, [4, 3, 1], corrupted=2, engines=2))
    assert counters.drafts == 10 and counters.corrupted == 4
    assert counters.accepted_per_position == {0: 8, 1: 6, 2: 2}


def test_the_real_032_page_without_speculative_decoding_has_none_of_the_families() -> None:
    counters = read_counters((DATA / "vllm-metrics-032.txt").read_text())
    assert counters == Counters(None, None, None, frozenset())


def test_every_position_moving_is_active() -> None:
    verdict = judge_spec_decode(read_counters(page(10, [8, 5, 2])), read_counters(page(30, [25, 14, 5])),
                                positions=3)
    assert verdict.ok is True
    assert verdict.sentence == "every draft position accepted tokens during the gate (0: 17, 1: 9, 2: 3; 20 drafts)."


@pytest.mark.parametrize(("after", "positions", "said"), [
    (page(30, [25, 14, 2]), 3, "1 of 3 draft positions accepted no token during the gate (position 2; 20 drafts)"),
    (page(10, [8, 5, 2]), 3, "no draft was proposed during the gate"),
    (page(30, [25, 14]), 3, "1 of 3 draft positions accepted no token during the gate (position 2"),  # missing
    ("vllm:num_requests_running 0\n", 3, "vLLM exports no vllm:spec_decode_num_accepted_tokens_per_pos_total"),
])
def test_a_position_that_stopped_accepting_is_inactive(after: str, positions: int, said: str) -> None:
    verdict = judge_spec_decode(read_counters(page(10, [8, 5, 2])), read_counters(after), positions=positions)
    assert verdict.ok is False and said in verdict.sentence


def test_nans_in_the_logits_are_corrupted_and_a_missing_family_is_said() -> None:
    before = read_counters(page(0, [], corrupted=1))
    assert judge_numerics(before, read_counters(page(0, [], corrupted=1))).ok is True
    moved = judge_numerics(before, read_counters(page(0, [], corrupted=4)))
    assert moved.ok is False and moved.sentence.startswith("3 requests had NaNs in their logits during the gate")
    assert judge_numerics(before, read_counters("vllm:num_requests_running 0\n")).ok is None


def test_the_real_032_pages_with_ngram_speculative_decoding() -> None:
    before = read_counters((DATA / "acceptance" / "vllm-032-ngram-metrics-before.txt").read_text())
    after = read_counters((DATA / "acceptance" / "vllm-032-ngram-metrics-after.txt").read_text())
    assert before.accepted_per_position == {0: 0, 1: 0, 2: 0} and before.corrupted == 0
    assert after.accepted_per_position == {0: 29, 1: 21, 2: 14} and after.drafts == 40
    verdict = judge_spec_decode(before, after, positions=3)
    assert verdict.ok is True and "(0: 29, 1: 21, 2: 14; 40 drafts)" in verdict.sentence
    assert judge_numerics(before, after).ok is True
    assert judge_spec_decode(after, after, positions=3).ok is False  # nothing moved between two equal pages
