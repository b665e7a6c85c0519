"""The soak's pure parts: the schedule is a function of its seed (a failing run is replayed with SOAK_SEED),
the footprint check compares a daemon with itself, the ledger counts a violation once per sentence."""

from __future__ import annotations

import itertools

import pytest
from invariants import Ledger, footprint_growth
from schedule import FAULTS, seconds_from_env, seed_from_env, steps


def test_the_same_seed_gives_the_same_schedule_and_no_fault_twice_in_a_row() -> None:
    first, again, other = steps(1234, 40), steps(1234, 40), steps(4321, 40)
    assert first == again and first != other
    assert all(a.kind != b.kind for a, b in itertools.pairwise(first))
    assert {s.kind for s in steps(7, 400)} == {f.name for f in FAULTS}


def test_seed_and_duration_from_the_environment() -> None:
    assert seed_from_env({"SOAK_SEED": "42"}) == 42
    assert 1 <= seed_from_env({}) < 2**31
    assert seconds_from_env({}) == 180 and seconds_from_env({"SOAK_SECONDS": "1800"}) == 1800
    with pytest.raises(ValueError, match="SOAK_SECONDS must be a positive number of seconds, not '-1'"):
        seconds_from_env({"SOAK_SECONDS": "-1"})


MIB = 1 << 20


@pytest.mark.parametrize(("series", "found"), [
    ([(0, 7, 60 * MIB, 20), (20, 7, 60 * MIB, 20), (200, 7, 61 * MIB, 21)], []),
    ([(0, 7, 60 * MIB, 20), (20, 7, 60 * MIB, 20), (200, 7, 200 * MIB, 21)], ["RSS grew from 60 MiB to 200 MiB"]),
    ([(0, 7, 60 * MIB, 20), (20, 7, 60 * MIB, 20), (200, 7, 60 * MIB, 400)], ["open descriptors grew from 20 to 400"]),
    ([(0, 7, 60 * MIB, 20), (5, 7, 300 * MIB, 900), (20, 7, 60 * MIB, 20), (200, 7, 61 * MIB, 20)], []),  # warm-up
    ([(0, 6, 10 * MIB, 5), (20, 6, 10 * MIB, 5), (30, 7, 60 * MIB, 20), (50, 7, 60 * MIB, 20),
      (200, 7, 61 * MIB, 20)], []),  # a restarted daemon is compared with itself
    ([], []),
])
def test_footprint_growth(series: list[tuple[float, int, int, int]], found: list[str]) -> None:
    assert footprint_growth(series) == found


def test_the_ledger_counts_a_sentence_instead_of_repeating_it() -> None:
    ledger = Ledger()
    ledger.during = "#3 log_flood"
    for _ in range(3):
        ledger.add("head: status.json does not parse")
    ledger.add("another")
    [first, second] = ledger.to_json()
    assert (first["what"], first["count"], first["during"], second["count"]) == \
        ("head: status.json does not parse", 3, "#3 log_flood", 1)
