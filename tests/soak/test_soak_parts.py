"""The soak's pure parts: the schedule is a function of its seed (a failing run is replayed with SOAK_SEED),
every kind it draws is a fault the runner knows, the footprint check compares a daemon with itself, the ledger
counts a violation once per sentence, launches that overlap are caught, an open breaker is named by its cause."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from catalogue import FAULTS as RUNNABLE
from invariants import (
    TICK_S,
    Launches,
    Ledger,
    Node,
    Sampler,
    breaker_violations,
    footprint_growth,
    mains_of,
    overlaps,
)
from neighbour import changes
from reloads import BREAKAGES as BREAKS
from runner import another
from schedule import (
    BREAKAGES,
    DOCKERD,
    FAULTS,
    first_step_from_env,
    kinds_from_env,
    seconds_from_env,
    seed_from_env,
    steps,
)
from soakpair import RESTART
from wedges import guard_floors

from sparkd.config import GuardConfig, RestartConfig


def test_the_same_seed_gives_the_same_schedule_and_no_fault_twice_in_a_row() -> None:
    first, again, other = steps(1234, 40), steps(1234, 40), steps(4321, 40)
    assert first == again and first != other
    assert all(a.kind != b.kind for a, b in itertools.pairwise(first))
    assert {s.kind for s in steps(7, 400)} == {f.name for f in FAULTS}


@pytest.mark.parametrize("seed", [1, 7, 160, 1391712872])
def test_every_kind_comes_once_before_any_comes_twice(seed: int) -> None:
    """A short soak (the suite's) meets every fault: the first steps are each kind once, in a seeded order."""
    for kinds in (FAULTS, (*FAULTS, DOCKERD)):
        opening = [s.kind for s in steps(seed, len(kinds), kinds)]
        assert sorted(opening) == sorted(f.name for f in kinds)
    assert [s.kind for s in steps(seed, 12)] != [s.kind for s in steps(seed + 1, 12)]


def test_seed_and_duration_from_the_environment() -> None:
    assert seed_from_env({"SOAK_SEED": "42"}) == 42
    assert 1 <= seed_from_env({}) < 2**31
    assert seconds_from_env({}) == 180 and seconds_from_env({"SOAK_SECONDS": "1800"}) == 1800
    assert first_step_from_env({}) == 0 and first_step_from_env({"SOAK_FROM": "67"}) == 67
    with pytest.raises(ValueError, match="SOAK_FROM must be a step number"):
        first_step_from_env({"SOAK_FROM": "x"})
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


def test_every_kind_the_schedule_draws_is_a_fault_the_runner_knows() -> None:
    assert {f.name for f in (*FAULTS, DOCKERD)} == set(RUNNABLE)
    assert kinds_from_env({}) == FAULTS and kinds_from_env({"SOAK_DOCKERD": "1"}) == (*FAULTS, DOCKERD)
    assert set(BREAKAGES) == set(BREAKS)
    RestartConfig(**RESTART)  # the soak's policy is a valid config


def test_the_leak_faults_floors_are_a_valid_guard_config_under_what_is_available() -> None:
    available = 20 << 30
    floors = guard_floors(available)
    GuardConfig(**floors)
    assert floors["kill_below"] < floors["stop_below"] == available - (1 << 30) <= floors["refuse_start_below"]


@pytest.mark.parametrize(("seen", "found"), [
    ({(10, 1.00): 5.0, (11, 5.00): 9.0}, []),  # one after the other: 10 last seen when 11 started
    ({(10, 1.00): 5.5, (11, 5.00): 9.0}, [((10, 1.00), (11, 5.00))]),  # 10 seen alive after 11 started
    ({(10, 1.00): 5.0 + TICK_S, (11, 5.00): 9.0}, []),  # within the start time's resolution
    ({(10, 1.00): 20.0, (11, 5.00): 9.0, (12, 9.5): 12.0}, [((10, 1.00), (11, 5.00)), ((10, 1.00), (12, 9.5))]),
    ({}, []),
])
def test_overlapping_launches(seen: dict[tuple[int, float], float], found: list[object]) -> None:
    assert overlaps(seen) == found


def test_launches_tells_an_overlap_once() -> None:
    launches = Launches({(10, 1.0): 6.0, (11, 5.0): 7.0})
    [(sentence, _)] = launches.observe([], 8.0)
    assert sentence == "two launches raced: a vLLM started while the previous one still ran"
    assert launches.observe([], 9.0) == []


def _failed(cls: str, reason: str, message: str = "what happened") -> dict[str, object]:
    return {"state": "failed", "breaker": {"open": True, "reason": reason},
            "last_failure": {"class": cls, "message": message}}


@pytest.mark.parametrize(("status", "found"), [
    ({"state": "ready"}, []),
    (_failed("peer_lost", "6 failures in a row without a stable run (limit 6)"),
     ["head: the restart breaker opened on a wait (peer_lost)"]),
    (_failed("hang", "4 failures in a row without a stable run (limit 4); fix"),
     ["head: the restart breaker opened on hang: failures in a row"]),
    (_failed("oom", "5 failures in 30 min (restart budget 5); fix"),
     ["head: the restart breaker opened on oom: the budget"]),
    (_failed("config_error", "config error fails the same way every time", ""),
     ["head: failed without a sentence", "head: the restart breaker opened on config_error"]),
])
def test_an_open_breaker_is_named_by_what_opened_it(status: dict[str, object], found: list[str]) -> None:
    lifecycle = {"consecutive": 4, "strikes": [{"class": "hang", "weight": 1, "at": 0}]}
    assert [sentence for sentence, _ in breaker_violations("head", status, lifecycle)] == found


def test_a_child_forked_by_the_main_is_not_a_second_main() -> None:
    """Seed 1391712872, #39: a child in the moment between its fork and its title showed the main's command
    line and was counted as a second vLLM racing the first."""
    assert mains_of({11228: 1, 11231: 11228}) == [11228]
    assert mains_of({11228: 1, 11300: 1}) == [11228, 11300]



def test_the_sampler_outlives_a_check_that_fails(tmp_path: Path) -> None:
    """Seed 160: a check that raised ended the sampler thread, and the invariants went unchecked from then on
    without a word. Now the failure is a violation and the sampling goes on."""
    ledger, calls = Ledger(), []

    def touched() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("ppid")
        return []

    node = Node("head", "sparkd-soak-none", tmp_path / "status.json", lambda: None)
    sampler = Sampler([node], ledger, touched, period=0.01)
    sampler.start()
    deadline = time.monotonic() + 60
    while sampler.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.halt.set()
    sampler.join(10)
    assert sampler.samples >= 3
    [violation] = ledger.to_json()
    assert violation["what"] == "the soak's sampler failed (KeyError); it samples on"


@pytest.mark.parametrize(("n", "now", "runs"), [
    (0, 0.0, True), (14, 119.0, True), (14, 125.0, True),  # the opening (15 kinds) finishes past the deadline
    (15, 119.0, True), (15, 120.0, False), (30, 500.0, False),
])
def test_the_opening_finishes_whatever_the_time(n: int, now: float, runs: bool) -> None:
    assert another(n, len(FAULTS), now, deadline=120.0) is runs


READY = {"state": "ready", "launches": 1, "restarts": 0}


@pytest.mark.parametrize(("now", "status", "sentences"), [
    ({"a": {(1, 1.0), (2, 2.0)}}, READY, []),
    ({"a": {(1, 1.0), (2, 2.0), (3, 3.0)}}, READY, []),  # a new process (a forked helper) is no change
    ({"a": {(1, 1.0)}}, READY, ["a neighbour's process changed: a lost 1 of its 2 processes"]),
    ({"a": {(1, 1.0), (2, 9.0)}}, READY, ["a neighbour's process changed: a lost 1 of its 2 processes"]),  # reused
    ({}, READY, ["a neighbour's process changed: a lost 2 of its 2 processes"]),
    ({"a": {(1, 1.0), (2, 2.0)}}, {**READY, "restarts": 1},
     ["the neighbour instance did not stay ready with one launch and no restart"]),
    ({"a": {(1, 1.0), (2, 2.0)}}, {**READY, "state": "backoff"},
     ["the neighbour instance did not stay ready with one launch and no restart"]),
])
def test_no_neighbour_pid_changes(now: dict[str, set[tuple[int, float]]], status: dict[str, object],
                                  sentences: list[str]) -> None:
    before = {"a": {(1, 1.0), (2, 2.0)}}
    assert [sentence for sentence, _ in changes(before, now, status)] == sentences


def test_the_sampler_counts_a_neighbour_change_at_every_sample(tmp_path: Path) -> None:
    ledger = Ledger()
    node = Node("head", "sparkd-soak-none", tmp_path / "status.json", lambda: None)
    sampler = Sampler([node], ledger, list, period=0.01,
                      neighbours=lambda: [("a neighbour's process changed: a lost 1 of its 2 processes", "gone: [2]")])
    sampler.start()
    deadline = time.monotonic() + 60
    while sampler.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.halt.set()
    sampler.join(10)
    [violation] = ledger.to_json()
    assert violation["what"].startswith("a neighbour's process changed") and violation["count"] >= 3


def test_soak_faults_picks_the_faults_of_a_run() -> None:
    from schedule import kinds_from_env

    assert [k.name for k in kinds_from_env({"SOAK_FAULTS": "slow_body, handshake_flood"})] == [
        "handshake_flood", "slow_body"]
    assert len(kinds_from_env({})) == len(FAULTS)
    with pytest.raises(ValueError, match="SOAK_FAULTS names no such fault: nope"):
        kinds_from_env({"SOAK_FAULTS": "nope"})


# ---- the notifier's hook (notifyhook.py; on unless SOAK_NOTIFY=0)


def test_the_notify_hook_judges_what_each_node_sent_its_webhook() -> None:
    from notifyhook import QUEUE, final_violations

    def sent(kind: str, cls: str | None = None) -> dict[str, object]:
        return {"path": "/json", "mode": "ok", "body": json.dumps({"kind": kind, "class": cls})}

    healthy = {"notify": {"targets": [{"name": "flaky-json", "queued": 0, "held_back": 0, "dropped": 0}]}}
    assert final_violations("head", healthy, [sent("watching"), sent("failure", "oom")], {"oom"}) == []
    assert final_violations("head", {}, [], set())[0].startswith("head: the daemon reports no notifier")
    said = final_violations("head", healthy, [sent("failure", "oom")], {"oom", "nccl"})
    assert said == ["head: its webhook never heard it start watching",
                    "head: failures of class nccl reached neither its webhook nor the notifier's held-back, dropped "
                    "or queued counts"]
    # a SIGKILLed daemon's counts died with it: what its last status accounted for still counts
    assert final_violations("head", healthy, [sent("watching")], {"nccl"}, earlier=2) == []
    held = {"notify": {"targets": [{"name": "flaky-json", "queued": QUEUE + 5, "held_back": 3}]}}
    assert final_violations("head", held, [sent("watching")], {"nccl"}) == [
        f"head: the notifier's queue for flaky-json grew past [notify] queue ({QUEUE + 5})"]


POST = """
import urllib.request
for n in range(4):
    try:
        request = urllib.request.Request("http://127.0.0.1:18911/json", data=b'{"kind": "watching"}', method="POST")
        urllib.request.urlopen(request, timeout=1)
    except Exception as exc:
        print(type(exc).__name__)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root (CI runs as root)")
def test_the_flaky_webhook_serves_inside_a_nodes_namespace_and_says_what_it_holds(tmp_path: Path) -> None:
    from notifyhook import FlakyWebhooks, section
    from pair_harness import Link

    from sparkd.config import config_from_mapping

    link = Link.create()
    hooks = FlakyWebhooks(tmp_path, {"head": link.head_ns}, 18911)
    try:
        config_from_mapping({"runtime": "process", "launch": {"model": "m"}, "notify": section(18911)}, env={})
        endpoint = hooks.endpoints["head"]
        deadline = time.monotonic() + 30
        while ":18911 " not in subprocess.run(["ip", "netns", "exec", link.head_ns, "ss", "-ltn"], text=True,
                                              capture_output=True, check=False).stdout:
            assert time.monotonic() < deadline and endpoint.proc.poll() is None, "the endpoint never listened"
            time.sleep(0.1)
        probe = subprocess.run(["ip", "netns", "exec", link.head_ns, sys.executable, "-c", POST], capture_output=True,
                               text=True, timeout=60, check=False)
        assert [r["mode"] for r in endpoint.received()][:3] == ["ok", "error", "hang"], probe.stdout + probe.stderr
        assert endpoint.held() == 1  # the hung request, held for HANG_S
    finally:
        hooks.close()
        link.destroy()
