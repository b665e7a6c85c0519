"""The stand-in's fault knobs on a head node: engine/worker death, exit, kill, free-memory refusal, master port
in use, stall, hang and leak. Real processes and sockets; each test cleans up what it started."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from standin_helpers import Standin, Standins, chat_body, free_port, http, metric_value, standins, wait_until


@pytest.fixture
def launch() -> Iterator[Standins]:
    with standins() as group:
        yield group


def _head(launch: Standins, port: int, *extra: str, **env: str) -> Standin:
    knobs = {f"SPARKD_STANDIN_{key.upper()}": value for key, value in env.items()}
    return launch.start("m", "--host", "127.0.0.1", "--port", str(port), "-tp", "2", *extra, env=knobs)


def test_engine_death_turns_health_503_then_exits_0(launch: Standins) -> None:
    """DIE_MODE=engine: 'Engine core proc ... died unexpectedly', /health 503, uvicorn stops, exit status 0."""
    port = free_port()
    standin = _head(launch, port, die_after="0.3", die_mode="engine")
    standin.wait_ready()
    standin.wait_for(r"ERROR .* Engine core proc EngineCore_DP0 died unexpectedly, shutting down client\.")
    assert http("127.0.0.1", port).get("/health").status_code == 503
    assert standin.wait_exit(20) == 0
    for line in (
        "INFO:     Shutting down",
        "INFO:     Application shutdown complete.",
        "INFO:     Finished server process",
    ):
        standin.wait_for(re.escape(line), timeout=1)


def test_worker_death_is_engine_death(launch: Standins) -> None:
    """DIE_MODE=worker: the EngineCore logs the worker's death and turns fatal; /health 503; exit 0."""
    port = free_port()
    standin = _head(launch, port, die_after="0.3", die_mode="worker")
    standin.wait_ready()
    standin.wait_for(
        r"\(EngineCore_DP0 pid=\d+\) ERROR .* Worker proc VllmWorker-0 died unexpectedly, shutting down executor\."
    )
    standin.wait_for(r"\(EngineCore_DP0 pid=\d+\) ERROR .* EngineCore encountered a fatal error\.")
    standin.wait_for(r"\(APIServer pid=\d+\) ERROR .* AsyncLLM output_handler failed\.")
    assert http("127.0.0.1", port).get("/health").status_code == 503
    assert standin.wait_exit(20) == 0


def test_die_exit_uses_the_exit_code_and_takes_the_children(launch: Standins) -> None:
    """DIE_MODE=exit: the process exits with DIE_EXIT_CODE after stopping its children."""
    standin = _head(launch, free_port(), die_after="0.2", die_mode="exit", die_exit_code="3")
    standin.wait_ready()
    children = [p.pid for p in standin.tree()[1:]]
    assert standin.wait_exit(20) == 3
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in children), timeout=10)


def test_die_kill_leaves_children_to_exit_on_their_own(launch: Standins) -> None:
    """DIE_MODE=kill: SIGKILL of the API server; its EngineCore and workers follow within seconds."""
    standin = _head(launch, free_port(), die_after="0.3", die_mode="kill")
    standin.wait_ready()
    children = [p.pid for p in standin.tree()[1:]]
    assert standin.wait_exit(20) == -signal.SIGKILL
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in children), timeout=15)


def test_free_memory_refusal_propagates_and_exits_1(launch: Standins) -> None:
    """FAIL_FREE_MEMORY: the worker's ValueError, WorkerProc/EngineCore failure lines, the API's RuntimeError."""
    standin = _head(launch, free_port(), "--gpu-memory-utilization", "0.9", fail_free_memory="1")
    assert standin.wait_exit(30) == 1
    text = standin.text()
    assert (
        "ValueError: Free memory on device (101.3/121.69 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes." in text
    )
    order = ["WorkerProc failed to start.", "EngineCore failed to start.",
             "RuntimeError: Engine core initialization failed. See root cause above. "
             "Failed core proc(s): {'EngineCore_DP0': 1}"]  # fmt: skip
    positions = [text.index(line) for line in order]
    assert positions == sorted(positions)
    assert standin.count("Application startup complete") == 0


def test_master_port_in_use_fails_with_eaddrinuse(launch: Standins) -> None:
    """nnodes=2: a taken master port fails rank 0 with torch's EADDRINUSE text; the API exits 1."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        master_port = holder.getsockname()[1]
        standin = launch.start(
            "m", "--port", str(free_port()), "-tp", "2", "--nnodes", "2", "--master-port", str(master_port)
        )
        assert standin.wait_exit(30) == 1
    standin.wait_for(
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
        f"port: {master_port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    standin.wait_for(re.escape("Failed core proc(s): {'EngineCore_DP0': 1}"))


def test_stall_keeps_health_200_but_generation_stops(launch: Standins) -> None:
    """STALL_AFTER: /health 200, a chat request never completes, num_requests_running > 0 and
    vllm:generation_tokens_total stops moving."""
    port = free_port()
    standin = _head(launch, port, stall_after="4.0")  # room for the first request on a loaded machine
    standin.wait_ready()
    client = http("127.0.0.1", port)
    assert client.post("/v1/chat/completions", json=chat_body("m", max_tokens=4)).status_code == 200
    time.sleep(4.5)
    with pytest.raises(httpx.ReadTimeout):
        http("127.0.0.1", port, 2.0).post("/v1/chat/completions", json=chat_body("m", max_tokens=2))
    with _raw_chat(port) as hung:  # a second request that stays in flight while we look
        assert client.get("/health").status_code == 200
        labels = {"engine": "0", "model_name": "m"}
        first = client.get("/metrics").text
        wait_until(lambda: (metric_value(client.get("/metrics").text, "vllm:num_requests_running", **labels) or 0) >= 1)
        time.sleep(1.0)
        second = client.get("/metrics").text
        assert metric_value(first, "vllm:generation_tokens_total", **labels) == metric_value(
            second, "vllm:generation_tokens_total", **labels
        )
        hung.settimeout(0.5)
        with pytest.raises(TimeoutError):
            hung.recv(1)
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == 0


@contextlib.contextmanager
def _raw_chat(port: int) -> Iterator[socket.socket]:
    """A chat request on a raw socket, closed (the client goes away) when the block ends."""
    body = json.dumps(chat_body("m")).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        yield sock


def test_hang_accepts_connections_but_never_answers(launch: Standins) -> None:
    """HANG_AFTER: the port still accepts connections but /health gets no answer; SIGTERM still ends it."""
    port = free_port()
    standin = _head(launch, port, hang_after="0.5")
    standin.wait_ready()
    time.sleep(1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    with pytest.raises(httpx.ReadTimeout):
        http("127.0.0.1", port, 1.5).get("/health")
    assert standin.proc.poll() is None
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == 0


def test_leak_grows_the_workers_resident_memory(launch: Standins) -> None:
    """LEAK_MB_PER_S: each worker allocates and touches memory up to LEAK_MAX_MB."""
    standin = _head(launch, free_port(), leak_mb_per_s="300", leak_max_mb="150")
    standin.wait_ready()
    worker = standin.titled()[f"{standin.title_prefix}::Worker_TP0"]
    wait_until(lambda: worker.memory_info().rss > 150 * 2**20, timeout=15)
    time.sleep(0.5)
    assert worker.memory_info().rss < 400 * 2**20  # capped


def test_stall_ends_in_rpc_timeout_and_engine_death(launch: Standins) -> None:
    """A stalled step makes the EngineCore warn about the broadcast ring, then time out the RPC and turn fatal."""
    port = free_port()
    env = {"SPARKD_STANDIN_STALL_AFTER": "0", "VLLM_RINGBUFFER_WARNING_INTERVAL": "1",
           "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3"}  # fmt: skip
    standin = launch.start("m", "--host", "127.0.0.1", "--port", str(port), "-tp", "2", env=env)
    standin.wait_ready()
    response = http("127.0.0.1", port, 30).post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert response.status_code == 500
    text = standin.text()
    assert "No available shared memory broadcast block found in 1 seconds. This typically happens when some " in text
    assert text.index("No available shared memory") < text.index("TimeoutError: RPC call to sample_tokens timed out.")
    standin.wait_for(r"\(EngineCore_DP0 pid=\d+\) ERROR .* EngineCore encountered a fatal error\.", timeout=1)
    assert standin.wait_exit(20) == 0


def test_max_model_len_beyond_the_model_is_a_config_error(launch: Standins) -> None:
    """--max-model-len above max_position_embeddings is refused (exit 1) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    args = ("m", "--port", str(free_port()), "--max-model-len", "1M")
    refused = launch.start(*args, env={"SPARKD_STANDIN_MAX_POSITION_EMBEDDINGS": "163840"})
    assert refused.wait_exit(30) == 1
    refused.wait_for(
        re.escape(
            "Value error, User-specified max_model_len (1048576) is greater than the derived max_model_len "
            "(max_position_embeddings=163840 or model_max_length=None in model's config.json). To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    )
    allowed = launch.start(
        *args, env={"SPARKD_STANDIN_MAX_POSITION_EMBEDDINGS": "163840", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    )
    allowed.wait_ready()
    allowed.wait_for(r"WARNING .* User-specified max_model_len \(1048576\) is greater than the derived", timeout=1)
    allowed.wait_for(r"Maximum concurrency for 1,048,576 tokens per request", timeout=1)
