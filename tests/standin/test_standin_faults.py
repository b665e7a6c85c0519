"""The stand-in's fault knobs on a head node: engine/worker death, exit, kill, free-memory refusal, master port
in use, stall, hang and leak. Real processes and sockets; each test cleans up what it started."""

from __future__ import annotations

import re
import signal
import socket
import time

import httpx
import psutil
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins, http, wait_until

INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
)


def _head(launch: Standins, port: int, *extra: str, **env: str) -> Standin:
    knobs = {f"SPARKD_STANDIN_{key.upper()}": value for key, value in env.items()}
    return launch.start("m", "--host", "127.0.0.1", "--port", str(port), "-tp", "2", *extra, env=knobs)


@pytest.mark.parametrize("version", ["0.13.0", "0.21.0"])
def test_engine_death_turns_health_503_then_exits_0(launch: Standins, version: str) -> None:
    """DIE_MODE=engine: /health 503, uvicorn stops, exit status 0. 0.13 first says 'Engine core proc ... died
    unexpectedly'; 0.21+'s monitor is silent and only the output handler's EngineDeadError is logged."""
    port = free_port()
    standin = _head(launch, port, die_after="0.3", die_mode="engine", vllm_version=version)
    standin.wait_ready()
    standin.wait_for(r"\(APIServer pid=\d+\) ERROR .* AsyncLLM output_handler failed\.")
    standin.wait_for(r"vllm\.v1\.engine\.exceptions\.EngineDeadError: EngineCore encountered an issue\.")
    assert http("127.0.0.1", port).get("/health").status_code == 503
    assert standin.wait_exit(20) == 0
    died = standin.count(r"ERROR .* \[core_client\.py:606\] Engine core proc EngineCore_DP0 died unexpectedly, "
                         r"shutting down client\.")  # fmt: skip
    assert died == (1 if version == "0.13.0" else 0)
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
        r"\(EngineCore pid=\d+\) ERROR .* Worker proc VllmWorker-0 died unexpectedly, shutting down executor\."
    )
    standin.wait_for(r"\(EngineCore pid=\d+\) ERROR .* EngineCore encountered a fatal error\.")
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
        "ValueError: Free memory on device cuda:0 (101.3/121.69 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes." in text
    )
    order = ["WorkerProc failed to start.", "EngineCore failed to start.", INIT_FAILED]
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
    standin.wait_for(re.escape(INIT_FAILED))


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


@pytest.mark.parametrize(
    ("crash", "env", "line"),
    [
        ("fork_shm", {}, "AttributeError: 'ShmRingBuffer' object has no attribute 'shared_memory'"),
        ("double_patch", {}, "UnboundLocalError: cannot access local variable 'w13' where it is not associated with "
                             "a value"),
        ("missing_module", {}, "ModuleNotFoundError: No module named 'deep_gemm'"),
        ("missing_module", {"missing_module": "cutlass"}, "ModuleNotFoundError: No module named 'cutlass'"),
    ],
)  # fmt: skip
def test_field_crashes_replay_while_the_model_loads(
    launch: Standins, crash: str, env: dict[str, str], line: str
) -> None:
    """CRASH: field report 002's startup crashes, in vLLM's chain: the worker's traceback ending in the line,
    WorkerProc failed to start, EngineCore failed to start, Engine core initialization failed, exit 1."""
    standin = _head(launch, free_port(), crash=crash, **env)
    assert standin.wait_exit(30) == 1
    text = standin.text()
    worker = r"\(Worker_TP\d pid=\d+\) ERROR .* \[multiproc_executor\.py:870\] "
    assert re.search(worker + "WorkerProc failed to start\\.", text), text
    assert re.search(worker + re.escape(line) + "$", text, re.M)
    chain = [text.index(step) for step in ("WorkerProc failed to start.", "EngineCore failed to start.", INIT_FAILED)]
    assert chain == sorted(chain)
    assert standin.count("Application startup complete") == 0
