"""Wedges and pauses as vLLM shows them: gauges that move only when a step completes (an idle wedge leaves them at
0), the shared-memory broadcast warnings and the RPC timeout, a JIT compile that pauses every request without
killing anything, and the periodic stats line. Real processes; each test cleans up what it started."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator

import drainwatch
import httpx
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins, http, metric_value, serving, wait_until

LABELS = {"engine": "0", "model_name": "m"}
NO_BLOCK = "No available shared memory broadcast block found in "
TIMED_OUT = "TimeoutError: RPC call to sample_tokens timed out."


def _head(launch: Standins, port: int, *extra: str, **knobs: str) -> Standin:
    env = {f"SPARKD_STANDIN_{key.upper()}": value for key, value in knobs.items() if key.islower()}
    env |= {key: value for key, value in knobs.items() if key.isupper()}
    return launch.start("m", "--host", "127.0.0.1", "--port", str(port), *extra, env=env)


def gauges(port: int) -> tuple[float | None, float | None, float | None]:
    text = http("127.0.0.1", port).get("/metrics").text
    return tuple(  # type: ignore[return-value]
        metric_value(text, name, **LABELS)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total")
    )


def still_for(port: int, hold_s: float, within_s: float) -> tuple[float | None, float | None, float | None] | None:
    """The gauges where they held still for ``hold_s`` (read every 0.25 s), within ``within_s``; None if they never
    did. A loaded API server counts tokens made just before a pause a moment late."""
    start = time.monotonic()
    readings: list[tuple[float, tuple[float | None, float | None, float | None]]] = []
    while time.monotonic() - start < within_s:
        now, seen = time.monotonic(), gauges(port)
        readings = [(at, g) for at, g in readings if g == seen] + [(now, seen)]
        if now - readings[0][0] >= hold_s:
            return seen
        time.sleep(0.25)
    return None


@contextlib.contextmanager
def _raw_completion(port: int, max_tokens: int = 16, stream: bool = False) -> Iterator[socket.socket]:
    """A completion request on a raw socket, left in flight while the block runs (closed at its end)."""
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": max_tokens, "stream": stream}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        yield sock


def test_idle_wedge_changes_no_gauge_and_ends_in_the_rpc_timeout(launch: Standins) -> None:
    """STALL_AFTER on an idle engine (tp=2): a request reaching the wedged engine is never published, so the
    gauges stay at the idle step's 0 while /health is 200; the EngineCore warns, then gives up after the RPC
    timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 s scaled by TIME_SCALE to 3 s): 500, /health 503, exit 0."""
    port = free_port()
    standin = _head(launch, port, "-tp", "2", stall_after="0", time_scale="0.01")
    serving(standin, port)
    before = gauges(port)
    assert before == (0.0, 0.0, 0.0)
    # /health watched throughout: the dead engine's 503 lasts the watchdog's 2.5 s, which a test thread woken only
    # after reading the last log line missed on a loaded run (connection refused: the server had gone)
    poller = drainwatch.Poller(f"http://127.0.0.1:{port}", interval_s=0.1).start()
    began = time.monotonic()
    try:
        with _raw_completion(port):
            time.sleep(1.0)
            assert http("127.0.0.1", port).get("/health").status_code == 200
            assert gauges(port) == before  # the scheduler has the request; no step published it
            standin.wait_for(NO_BLOCK + "60 seconds", timeout=10)
            standin.wait_for(re.escape(TIMED_OUT), timeout=15)
        standin.wait_for(r"\(EngineCore pid=\d+\) ERROR .* \[core\.py:1142\] EngineCore encountered a fatal "
                         r"error\.")
        standin.wait_for(r"AsyncLLM output_handler failed\.")
        assert standin.wait_exit(20) == 0
    finally:
        poller.stop()
    seen = drainwatch.runs(poller.health, began)
    assert seen[0] == "200" and "503" in seen, seen


def test_wedge_mid_generation_freezes_the_gauges_at_the_last_step(launch: Standins) -> None:
    """A wedge while a request generates: running stays 1 and generation_tokens_total stops (the field's
    signature, local-inference-lab/vllm#827); the stats line shows 0.0 tokens/s once, then only DEBUG."""
    port = free_port()
    env = {"VLLM_LOG_STATS_INTERVAL": "0.5", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
    standin = _head(launch, port, "-tp", "2", stall_after="3", tokens_per_s="20", **env)
    serving(standin, port)
    with _raw_completion(port, max_tokens=100000, stream=True):
        wait_until(lambda: (gauges(port)[2] or 0) > 0, timeout=10)
        standin.wait_for(r"Avg generation throughput: 0\.0 tokens/s, Running: 1 reqs", timeout=20)
        frozen = gauges(port)
        time.sleep(1.5)
        assert gauges(port) == frozen and frozen[0] == 1.0
        mark = len(standin.lines)
        time.sleep(1.5)
        assert not any("Engine 000" in line for line in standin.lines[mark:])  # idle: DEBUG, not shown
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == 0


def test_wedge_of_a_single_in_process_rank_hangs_for_good(launch: Standins) -> None:
    """tp=1 (the uni executor): no message queue, no RPC timeout; a wedged step hangs and vLLM says nothing."""
    port = free_port()
    standin = _head(launch, port, stall_after="0", time_scale="0.01")
    serving(standin, port)
    with pytest.raises(httpx.ReadTimeout):
        http("127.0.0.1", port, 5.0).post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert http("127.0.0.1", port).get("/health").status_code == 200
    assert standin.count(NO_BLOCK) == 0 and standin.count("TimeoutError") == 0
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == 0


def test_rpc_timeout_and_warning_interval_come_from_vllms_variables(launch: Standins) -> None:
    """VLLM_RINGBUFFER_WARNING_INTERVAL and VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS are honoured as given."""
    port = free_port()
    env = {"VLLM_RINGBUFFER_WARNING_INTERVAL": "1", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3"}
    standin = _head(launch, port, "-tp", "2", stall_after="0", **env)
    serving(standin, port)
    response = http("127.0.0.1", port, 30).post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert response.status_code == 500
    standin.wait_for(re.escape(TIMED_OUT), timeout=20)  # the EngineCore's line may reach the pipe after the answer
    text = standin.text()
    assert text.index(NO_BLOCK + "1 seconds. This typically happens") < text.index(TIMED_OUT)
    assert standin.wait_exit(20) == 0


def test_jit_compile_pauses_every_request_then_serving_resumes(launch: Standins) -> None:
    """JIT_AFTER: a new request's step compiles a kernel first (0.24 warns; flashinfer logs the build). Every
    request waits: running stays 1 and no token is produced, the EngineCore warns about the broadcast ring; the
    compile ends before the RPC timeout and both requests complete."""
    port = free_port()
    # An 8 s compile under a 20 s execute timeout (1000 s scaled by 0.02): the compile begins at the first step past
    # JIT_AFTER, while the first request decodes, so a 4 s one left a loaded host's test too little of it to watch.
    standin = _head(launch, port, "-tp", "2", vllm_version="0.24.0", jit_after="5", jit_seconds="8",
                    time_scale="0.02", tokens_per_s="50", VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="1000")  # fmt: skip
    serving(standin, port)
    results: list[int] = []

    def complete(max_tokens: int) -> None:
        response = http("127.0.0.1", port, 60).post("/v1/completions", json={"prompt": "hi", "max_tokens": max_tokens})
        results.append(response.status_code)

    threading.Thread(target=complete, args=(800,)).start()
    wait_until(lambda: (gauges(port)[2] or 0) > 0, timeout=10)
    time.sleep(6.5)  # past JIT_AFTER: the next step (the second request's prefill) compiles
    threading.Thread(target=complete, args=(4,)).start()
    standin.wait_for(r"flashinfer\.jit: Loading JIT ops: ", timeout=10)
    paused = still_for(port, 1.0, within_s=6.0)  # tokens made before the compile may be counted late
    assert paused is not None and paused[0] == 1.0, "no token for a whole second while the kernel compiles"
    standin.wait_for(r"flashinfer\.jit: Finished loading JIT ops: ", timeout=20)
    wait_until(lambda: len(results) == 2, timeout=30)
    assert results == [200, 200]
    assert (gauges(port)[2] or 0) > (paused[2] or 0)
    text = standin.text()
    assert re.search(r"\(Worker_TP0 pid=\d+\) WARNING .* \[jit_monitor\.py:106\] Triton kernel JIT compilation "
                     r"during inference: \w+\. This causes a latency spike", text)  # fmt: skip
    assert text.index("Loading JIT ops") < text.index(NO_BLOCK) < text.index("Finished loading JIT ops")
    assert TIMED_OUT not in text and standin.proc.poll() is None


def _clock(line: str) -> int:
    hours, minutes, seconds = map(int, re.search(r" (\d\d):(\d\d):(\d\d) \[", line).groups())  # type: ignore[union-attr]
    return hours * 3600 + minutes * 60 + seconds


def test_stats_line_comes_at_vllms_own_interval(launch: Standins) -> None:
    """Without VLLM_LOG_STATS_INTERVAL the line comes every 10 s while there is traffic: the first one a full
    interval after the server started (by the lines' own clocks)."""
    port = free_port()
    standin = _head(launch, port, tokens_per_s="20")
    serving(standin, port)
    with _raw_completion(port, max_tokens=100000, stream=True):
        stats = standin.wait_for(r"\[loggers\.py:271\] Engine 000: Avg prompt throughput: .*", timeout=40).string
    started = standin.wait_for(r"Starting vLLM server on", timeout=1).string
    assert (_clock(stats) - _clock(started)) % 86400 >= 9
