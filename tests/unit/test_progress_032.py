"""vLLM 0.32's lines as the real-vLLM tier records them (its CPU build): a world of one waits for no peer, the compile
warm-up is compiling, the KV lines are read whatever the device word, the throughput line's new segments parse, and
`launching` is timed like every other phase (issue 25 §6)."""

from __future__ import annotations

from functools import reduce
from pathlib import Path

import pytest
from loop_harness import config, running

from sparkd.supervisor.progress import Phase, Startup, advance
from sparkd.supervisor.servelog import Throughput, read_serve_line
from sparkd.supervisor.timing import LaunchTiming
from sparkd.testing import FakeClock, FakeRuntime

START = (Path(__file__).resolve().parents[1] / "data" / "vllm-logs" / "realvllm-032-ready-then-stopped.log"
         ).read_text().split("\n---\n", 1)[1].splitlines()


def phases(lines: list[str]) -> list[Phase]:
    seen: list[Phase] = []

    def step(p: Startup, line: str) -> Startup:
        q = advance(p, line, 0.0)
        if q.phase is not p.phase:
            seen.append(q.phase)
        return q

    reduce(step, lines, Startup())
    return seen


def test_a_real_032_cpu_start_goes_through_every_phase_but_the_peer_wait() -> None:
    assert phases(START) == [Phase.loading_weights, Phase.compiling, Phase.kv_cache, Phase.api_starting, Phase.ready]


def test_the_cpu_builds_kv_lines_are_read() -> None:
    progress = reduce(lambda p, line: advance(p, line, 0.0), START, Startup())
    assert progress.kv_cache_gib == 1.0 and progress.kv_cache_tokens == 2_097_152
    assert progress.max_concurrency == 4096.0 and progress.world_size == 1 and progress.shards_total == 1


def test_a_world_of_two_still_waits_for_its_peer() -> None:
    line = ("(Worker pid=9) INFO 11-27 08:38:50 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 "
            "distributed_init_method=tcp://10.0.0.1:29501 backend=nccl")
    assert advance(Startup(), line, 0.0).phase is Phase.waiting_for_peer


def test_the_throughput_line_with_0_32s_segments() -> None:
    line = ("(APIServer pid=1) INFO 11-27 08:39:54 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
            "Avg generation throughput: 1.7 tokens/s, Running: 2 reqs, Waiting: 3 reqs, Deferred: 1 reqs, KV fetch: 1 "
            "waiting to start, 0 in progress, 0 completed waiting, Preemptions: 2, GPU KV cache usage: 4.5%, Prefix "
            "cache hit rate: 0.0%")
    assert read_serve_line(line) == Throughput("000", 1.0, 1.7, 2, 3, 4.5)
    cpu = next(raw for raw in (Path(__file__).resolve().parents[1] / "data" / "vllm-logs" /
                               "realvllm-032-engine-core-sigstop-in-flight.log").read_text().splitlines()
               if "CPU KV cache usage" in raw)
    seen = read_serve_line(cpu)
    assert isinstance(seen, Throughput) and seen.kv_cache_usage_pct is not None


def test_launching_is_timed() -> None:
    timing = LaunchTiming(requested_at=0.0, exec_at=1.0).phase(Phase.launching, 1.0)
    timing = timing.phase(Phase.loading_weights, 23.5).ready(40.0)
    assert timing.phase_seconds() == {"launching": 22.5, "loading_weights": 16.5}


@pytest.mark.anyio
async def test_the_daemon_times_launching_from_the_exec(tmp_path: Path) -> None:
    """Imports and the engine's spawn (half of a real 0.32 start) are in status like every later phase."""
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("starting")
        clock.advance(20)
        runtime.say(START[next(i for i, raw in enumerate(START) if "Starting to load model" in raw)])
        await node.until(lambda: node.daemon.sup.current.startup.phase is Phase.loading_weights)
        runtime.serve()
        await node.until_state("ready")
        phases_s = node.status()["start_timing"]["phases_s"]
    assert phases_s["launching"] >= 20, phases_s
