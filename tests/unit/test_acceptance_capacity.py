"""Capacity (sparkd/supervisor/acceptance/capacity.py): the KV cache and the maximum concurrency vLLM logged against
the profile's band (field report 004: 1.9-2.0 M tokens, 1.8-1.9x for the 1M profile) and the golden's; a loss says
how much."""

from __future__ import annotations

import pytest

from sparkd.config import config_from_mapping
from sparkd.supervisor.acceptance.answers import Capacity
from sparkd.supervisor.acceptance.capacity import judge_capacity

FIELD = Capacity(1_990_142, 1.90, 1_048_576, 20.0)  # the DSpark checkpoint's boot log (kv GiB: ours)


def band() -> tuple[list[int], list[float]]:
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "m", "profile": "1m-context"}})
    return cfg.acceptance.kv_cache_tokens, cfg.acceptance.max_concurrency


@pytest.mark.parametrize(("tokens", "concurrency"), [(1_990_142, 1.90), (2_044_166, 1.95), (1_901_239, 1.81)])
def test_the_field_reports_three_checkpoints_are_within_the_1m_profiles_band(tokens: int, concurrency: float) -> None:
    kv, conc = band()
    result = judge_capacity(Capacity(tokens, concurrency, 1_048_576), band_tokens=kv, band_concurrency=conc,
                            source="profile 1m-context")
    assert result.ok is True, result.sentence


def test_below_the_band_says_how_much_and_where_the_band_came_from() -> None:
    kv, conc = band()
    result = judge_capacity(Capacity(1_700_000, 1.62, 1_048_576, 17.0), band_tokens=kv, band_concurrency=conc,
                            source="profile 1m-context")
    assert result.ok is False and result.lost_tokens == 200_000
    assert result.sentence == (
        "vLLM's KV cache holds 1,700,000 tokens (maximum concurrency 1.62x for 1,048,576 tokens): below profile "
        "1m-context's band of 1,900,000–2,050,000 tokens; maximum concurrency 1.62x is outside profile 1m-context's "
        "band 1.8–1.96x.")


def test_a_leaked_gib_against_the_golden_is_named_in_gib() -> None:
    now = Capacity(1_890_635, 1.80, 1_048_576, 19.0)  # one GiB of a 20 GiB pool gone
    result = judge_capacity(now, golden=FIELD, tolerance=0.03)
    assert result.ok is False and result.lost_tokens == 99_507
    assert result.lost_gib == pytest.approx(1.0, abs=0.01)
    assert "99,507 (5.0%), about 1.00 GiB of KV cache, fewer than the golden's 1,990,142" in result.sentence


def test_within_the_tolerance_of_the_golden_passes() -> None:
    result = judge_capacity(Capacity(1_960_000, 1.87, 1_048_576), golden=FIELD, tolerance=0.03)
    assert result.ok is True and result.sentence.endswith("as expected (the golden's).")


def test_above_the_band_is_a_verdict_too() -> None:
    result = judge_capacity(Capacity(4_000_000), band_tokens=[1_900_000, 2_050_000])
    assert result.ok is False and "above the config's band" in result.sentence and result.lost_tokens is None


def test_no_kv_line_is_not_judged() -> None:
    result = judge_capacity(Capacity(), band_tokens=[1, 2], golden=FIELD)
    assert result.ok is None and "capacity not checked" in result.sentence
