"""Postmortem rules as tables of scripted histories: a node's last records in, the class and the sentence out;
nodes on one clock from their heartbeat offsets; the memory settle and the restart gate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from sparkd.recorder.baseline import Baseline, Verdict, reboot_verdict, settled
from sparkd.recorder.excerpt import RunSummary
from sparkd.recorder.postmortem import NodeRing, analyse, offsets, silences
from sparkd.recorder.record import Floors, PeerMark, Record
from sparkd.recorder.rules import CLASSES, classify_silence, memory_trend

GIB, MIB = 1 << 30, 1 << 20
HEAD_BOOT, HEAD_BOOT_2, WORKER_BOOT = ("00000000-0000-0000-0000-00000000000" + c for c in "123")
FLOORS = Floors(8 * GIB, 4 * GIB, 2 * GIB)
T0 = 1_800_000_000.0


def rec(t: float, avail_gib: float = 40.0, **kw: Any) -> Record:
    return Record(**{"wall": T0 + t, "mono": t, "boot": HEAD_BOOT, "run": 1, "available": int(avail_gib * GIB),
                     "state": "ready", "phase": "ready", "running": 0, "floors": FLOORS, **kw})


def history(n: int, avail: Callable[[int], float], **kw: Any) -> list[Record]:
    return [rec(float(t), avail(t), **kw) for t in range(n)]


def leak(t: int) -> float:
    """40 GiB falling 1.25 GiB/s from t=20 on, to 0.3 GiB (under the kill floor from t=51)."""
    return max(40.0 - 1.25 * max(0, t - 20), 0.3)


CASES: list[tuple[str, list[Record], str, list[str]]] = [
    ("memory ran out during a long prefill", history(60, leak, running=3, prompt_tps=9100.0), "host_froze",
     ["froze 8 s after MemAvailable fell below 2.0 GiB", "the guard's kill floor", "falling 689 MiB/s",
      "while vLLM served 3 requests, 9,100 prompt tokens/s"]),
    ("under the warn floor with PSI full at 60 %",
     history(30, lambda t: 6.0, psi_full=60.0), "host_froze", ["fell below 8.0 GiB", "PSI full 60 %"]),
    ("under the warn floor with the driver out of memory",
     [*history(29, lambda t: 7.0), rec(29, 7.0, kernel=("NVRM: ... NV_ERR_NO_MEMORY",))], "host_froze",
     ["NV_ERR_NO_MEMORY in the kernel log"]),
    ("a GPU that fell off the bus", [*history(20, lambda t: 40.0),
                                     rec(20, kernel=("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus",)),
                                     *history(5, lambda t: 40.0)], "gpu_error", ["the GPU reported a fault", "Xid"]),
    ("the kernel OOM killer", [*history(20, lambda t: 30.0),
                               rec(20, 30.0, kernel=("Out of memory: Killed process 42 (python3)",))], "oom",
     ["OOM killer"]),
    ("a failure sparkd recorded", [*history(20, lambda t: 30.0),
                                   rec(20, 30.0, events=("ready → stopping: engine_dead: The vLLM engine died.",))],
     "engine_dead", ["after sparkd recorded ready → stopping: engine_dead"]),
    ("a healthy node whose sparkd was killed", history(30, lambda t: 30.0), "unknown",
     ["nothing in its last records to explain it", "MemAvailable 30.0 GiB", "while vLLM was idle"]),
    ("still starting when it froze", history(60, leak, state="starting", phase="loading_weights"), "host_froze",
     ["while vLLM was starting (loading_weights)"]),
    ("low but not under a floor, no pressure", history(30, lambda t: 6.0), "unknown", ["MemAvailable 6.0 GiB"]),
]


@pytest.mark.parametrize(("window", "cls", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_silence_is_classified_from_its_last_records(window: list[Record], cls: str, says: list[str]) -> None:
    cause = classify_silence(window)
    assert cause.cls == cls and cls in CLASSES
    for fragment in says:
        assert fragment in cause.clause, cause.clause
    assert cause.evidence and cause.evidence[-1] == window[-1]


def test_the_memory_trend_reads_the_last_minute() -> None:
    assert memory_trend(history(60, leak)) == "falling 689 MiB/s over the last 59 s"
    assert memory_trend(history(60, lambda t: 10.0)) == "flat over the last 59 s"
    assert memory_trend([rec(0)]) is None


def run(boot: str, first: float, last: float, clean: bool, run_id: int = 1) -> RunSummary:
    return RunSummary(boot, run_id, T0 + first, T0 + last, int(last - first) + 1, clean)


def pair(*, head_reboots: bool = True, worker_offset: float = 0.0, head_readable: bool = True) -> list[NodeRing]:
    """The issue's freeze: the head leaks and goes silent at t=59; the worker (whose clock runs ``worker_offset``
    ahead) loses it and declares peer_lost 3 s later; the head comes back at t=300."""
    head_records = [replace(r, peers=(PeerMark("worker", 0.3, worker_offset, True),))
                    for r in history(60, leak, running=3, prompt_tps=9100.0)]
    worker_records = []
    for t in range(0, 120):
        up = t <= 59
        events = ("ready → stopping: peer_lost: The head's sparkd has been unreachable for 3 s.",) if t == 62 else ()
        worker_records.append(Record(
            wall=T0 + t + worker_offset, mono=t, boot=WORKER_BOOT, run=2, available=30 * GIB, state="ready",
            floors=FLOORS, peers=(PeerMark("head", 0.3 if up else t - 59, -worker_offset, up),), events=events))
    back = run(HEAD_BOOT_2 if head_reboots else HEAD_BOOT, 300, 400, False, run_id=5)
    head = NodeRing("head", 0, "head", now=T0 + 400, runs=(run(HEAD_BOOT, 0, 59, False), back),
                    records=tuple(head_records)) if head_readable else \
        NodeRing("head", None, None, error="sparkd on 10.0.0.1:9479 does not answer")
    worker = NodeRing("worker", 1, "worker", now=T0 + 400 + worker_offset,
                      runs=(RunSummary(WORKER_BOOT, 2, T0 + worker_offset, T0 + 400 + worker_offset, 400, False),),
                      records=tuple(worker_records))
    return [head, worker]


def test_the_freeze_on_a_pair_reads_as_one_sentence() -> None:
    report = analyse(pair(), reference="head")
    assert len(report.findings) == 1
    f = report.findings[0]
    assert f.cls == "host_froze" and f.at == T0 + 59
    assert report.headline == f.sentence
    assert f.sentence.startswith("rank 0 (head) froze 8 s after MemAvailable fell below 2.0 GiB")
    assert "at 2027-01-15 08:00:59 UTC" in f.sentence
    assert "the host rebooted and sparkd recorded again 4 min later" in f.sentence
    assert "rank 1 (worker) lost its peer 3 s later (sparkd declared peer_lost)" in f.sentence


def test_clocks_are_aligned_from_the_heartbeat_offsets() -> None:
    nodes = pair(worker_offset=7.5)
    assert offsets(nodes, "head") == {"head": 0.0, "worker": 7.5}
    assert offsets(nodes, "worker") == {"head": -7.5, "worker": 0.0}
    f = analyse(nodes, reference="head").findings[0]
    assert "lost its peer 3 s later" in f.sentence  # not 10.5 s: the worker's clock is 7.5 s ahead
    assert analyse(nodes, reference="worker").findings[0].at == T0 + 59 + 7.5


def test_a_daemon_killed_on_a_host_that_did_not_reboot_says_so() -> None:
    f = analyse(pair(head_reboots=False), reference="head").findings[0]
    assert "the host did not reboot: sparkd itself ended (killed or crashed) and came back 4 min later" in f.sentence


def test_a_node_that_cannot_be_read_goes_silent_at_its_last_heartbeat() -> None:
    report = analyse(pair(head_readable=False), reference="worker")
    f = report.findings[0]
    assert f.node == "head" and f.at == pytest.approx(T0 + 59 - 0.3)
    assert "its own ring could not be read" in f.sentence and "lost its peer 3 s later" in f.sentence
    assert report.unreadable == ("head: sparkd on 10.0.0.1:9479 does not answer",)


def test_clean_exits_and_the_live_run_are_not_silences() -> None:
    node = NodeRing("solo", now=T0 + 100, runs=(run(HEAD_BOOT, 0, 40, True), run(HEAD_BOOT, 50, 99, False)))
    assert silences(node) == []
    report = analyse([node], "solo")
    assert report.findings == () and report.headline.startswith("No node went silent")
    stale = replace(node, now=T0 + 200)  # the newest run stopped recording 100 s ago
    assert [s.at for s in silences(stale)] == [T0 + 99]


def test_since_leaves_older_silences_out() -> None:
    assert analyse(pair(), "head", since=T0 + 100).findings == ()


# ---- the memory settle and the restart gate


@pytest.mark.parametrize(("samples", "now", "value"), [
    ([(0.0, 10 * GIB), (1.0, 10 * GIB), (3.0, 10 * GIB + 100 * MIB)], 3.0, 10 * GIB),
    ([(0.0, 10 * GIB), (1.0, 12 * GIB), (3.0, 14 * GIB)], 3.0, None),  # still coming back
    ([(1.0, 10 * GIB), (3.0, 10 * GIB)], 3.0, None),  # the samples do not reach back 3 s yet
    ([(0.0, 5 * GIB), (0.5, 14 * GIB), (3.5, 14 * GIB)], 3.5, 14 * GIB),  # returned, then stable for 3 s
], ids=["stable", "rising", "too-short", "returned-then-stable"])
def test_memory_settles_when_it_stays_within_the_band(samples: list[tuple[float, int]], now: float,
                                                      value: int | None) -> None:
    assert settled(samples, now, 3.0, GIB) == value


def test_a_gap_in_the_samples_is_not_a_settled_window() -> None:
    # Stable samples until vLLM was started, none while it ran, then one equal sample after it died: the memory
    # in between was not watched, so the window is not settled until the samples cover it at their cadence.
    samples = [(t / 4, 10 * GIB) for t in range(9)] + [(3.0, 10 * GIB)]
    assert settled(samples, 3.0, 2.0, GIB) == 10 * GIB
    assert settled(samples, 3.0, 2.0, GIB, max_gap_s=0.5) is None
    covered = samples + [(3.0 + t / 4, 10 * GIB) for t in range(1, 9)]
    assert settled(covered, 5.0, 2.0, GIB, max_gap_s=0.5) == 10 * GIB


def base(*gib: float) -> list[Baseline]:
    return [Baseline(float(i), int(g * GIB)) for i, g in enumerate(gib)]


@pytest.mark.parametrize(("baselines", "falls", "says"), [
    (base(100, 99, 98, 97), 3, "reboot needed: 3 restarts lost 3.0 GiB that was never returned"),
    (base(100, 99, 98), None, None),  # two falls, far from the floor: not yet
    (base(100, 99, 99.8, 98.9), None, None),  # memory came back once: the run of falls is one long
    (base(100, 99.9, 99.8, 99.7), None, None),  # 100 MiB a time is noise under the 512 MiB minimum
    (base(30, 25, 20), 2, "one more would leave under 16.0 GiB"),  # two falls, the next under the floor
    (base(100, 97, 100, 98, 96, 94), 3, "MemAvailable after each stop: 100.0 GiB → 98.0 GiB → 96.0 GiB → 94.0 GiB"),
], ids=["three-falls", "two-falls", "returned", "noise", "near-the-floor", "after-a-recovery"])
def test_the_restart_gate(baselines: list[Baseline], falls: int | None, says: str | None) -> None:
    verdict = reboot_verdict(baselines, falls=3, min_fall=512 * MIB, floor=16 * GIB)
    if falls is None:
        assert verdict is None
        return
    assert verdict is not None and verdict.falls == falls and says is not None and says in verdict.sentence
    assert verdict.sentence.startswith("reboot needed: ")


def test_the_gate_can_be_turned_off() -> None:
    assert reboot_verdict(base(100, 90, 80, 70, 60), falls=0, min_fall=0, floor=0) is None


def test_memory_a_process_took_is_no_memory_the_driver_kept() -> None:
    """A fall of MemAvailable counts only as far as the driver's share (meminfo's residual) rose with it: a
    neighbour that grew by 2.5 GiB between two stops (a soak beside the suite's real vLLM read 21.9 → 21.1 → 19.5 GiB)
    needs no reboot; the same falls with the residual rising do."""
    def gate(*steps: tuple[float, float]) -> Verdict | None:
        baselines = [Baseline(float(i), int(a * GIB), int(r * GIB)) for i, (a, r) in enumerate(steps)]
        return reboot_verdict(baselines, falls=3, min_fall=512 * MIB, floor=19 * GIB)

    assert gate((21.9, 1.0), (21.1, 1.0), (19.5, 1.1)) is None  # the residual flat: other processes' pages
    kept = gate((21.9, 1.0), (21.1, 1.8), (19.5, 3.4))
    assert kept is not None and kept.falls == 2 and "lost 2.4 GiB" in kept.sentence, kept
    partly = gate((30, 1), (28, 1.6), (26, 2.2), (24, 2.3))  # the last fall mostly a process's: the run is broken
    assert partly is None
