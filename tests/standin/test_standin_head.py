"""The stand-in's head node: startup lines and order, the port, HTTP endpoints, process titles, /dev/shm,
signals. Real processes and sockets; each test cleans up the processes and /dev/shm files it caused."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins, chat_body, http, metric_value, serving, standins, wait_until

MODEL = "/models/Qwen3-30B"
NAME = "test-model"


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[Standin, int]]:
    """One ready head (tp=2 on one node: EngineCore + Worker_TP0 + Worker_TP1) shared by read-only tests."""
    port = free_port()
    with standins() as group:
        standin = group.start(
            MODEL, "--served-model-name", NAME, "alias", "--host", "127.0.0.1", "--port", str(port), "-tp", "2",
            "--max-model-len", "32K", "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
            env={"VLLM_LOG_STATS_INTERVAL": "0.5", "SPARKD_STANDIN_TOKENS_PER_S": "500"},
        )  # fmt: skip
        serving(standin, port)  # ready and listening: the ready line comes just before uvicorn listens
        yield standin, port


def _connect(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_port_refuses_connections_until_startup_complete(launch: Standins) -> None:
    """The API port is bound while loading (a second bind fails) but refuses connections; /health 200 after."""
    port = free_port()
    standin = launch.start("m", "--host", "127.0.0.1", "--port", str(port), startup_seconds=2.0)
    standin.wait_for("Initializing a V1 LLM engine")
    with pytest.raises(ConnectionRefusedError):
        _connect(port)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    assert standin.count("Application startup complete") == 0
    standin.wait_ready()
    assert http("127.0.0.1", port).get("/health").status_code == 200


def test_json_flag_arrives_intact_in_non_default_args(head: tuple[Standin, int]) -> None:
    """The parsed JSON flag shows in 'non-default args' as a dict."""
    standin, _ = head
    line = standin.wait_for(r"non-default args: (.*)$").group(1)
    assert "'compilation_config': {'cudagraph_mode': 'FULL_DECODE_ONLY'}" in line
    assert "'served_model_name': ['test-model', 'alias']" in line


def test_health_ping_version_load(head: tuple[Standin, int]) -> None:
    """/health and /ping are 200 with an empty body; /version and /load have vLLM's shapes."""
    _, port = head
    client = http("127.0.0.1", port)
    for response in (client.get("/health"), client.get("/ping"), client.post("/ping")):
        assert (response.status_code, response.content) == (200, b"")
    assert client.get("/version").json() == {"version": "0.21.0"}
    assert client.get("/load").json() == {"server_load": 0}
    assert client.get("/sleep").status_code == 404


def test_models_lists_one_card_per_served_name(head: tuple[Standin, int]) -> None:
    """/v1/models has every key (nulls included), one card per served name, root = the model path."""
    _, port = head
    body = http("127.0.0.1", port).get("/v1/models").json()
    assert body["object"] == "list"
    assert [card["id"] for card in body["data"]] == [NAME, "alias"]
    card = body["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert (card["root"], card["parent"], card["max_model_len"], card["owned_by"]) == (MODEL, None, 32768, "vllm")
    permission = card["permission"][0]
    assert permission["group"] is None and permission["object"] == "model_permission"
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", permission["id"])


def test_chat_completion_json(head: tuple[Standin, int]) -> None:
    """A non-streaming chat returns vLLM's full body with max_tokens tokens and usage."""
    _, port = head
    response = http("127.0.0.1", port).post("/v1/chat/completions", json=chat_body(NAME, "one two three", max_tokens=5))
    assert response.status_code == 200
    body = response.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert (body["object"], body["model"]) == ("chat.completion", NAME)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["message"]["tool_calls"] == [] and "reasoning_content" in choice["message"]
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 8,
        "completion_tokens": 5,
        "prompt_tokens_details": None,
    }


def test_chat_completion_stream_ends_with_done(head: tuple[Standin, int]) -> None:
    """SSE: a role chunk first, content chunks, finish_reason on the last, an optional usage chunk, [DONE]."""
    _, port = head
    body = chat_body(NAME, max_tokens=4, stream=True, stream_options={"include_usage": True})
    with http("127.0.0.1", port).stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:5]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_text_completion_json_and_stream(head: tuple[Standin, int]) -> None:
    """/v1/completions answers in the text_completion shapes."""
    _, port = head
    client = http("127.0.0.1", port)
    body = client.post("/v1/completions", json={"model": "alias", "prompt": "say hi", "max_tokens": 3}).json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 3
    with client.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True}) as resp:
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) == 3
    assert json.loads(events[0][6:])["choices"][0]["prompt_token_ids"] is None


def test_request_errors(head: tuple[Standin, int]) -> None:
    """Unknown model → 404 NotFoundError; a prompt of max_model_len words → 400."""
    _, port = head
    client = http("127.0.0.1", port)
    response = client.post("/v1/chat/completions", json=chat_body("nope"))
    assert response.status_code == 404
    assert response.json() == {
        "error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": None, "code": 404}
    }
    response = client.post("/v1/chat/completions", json=chat_body(NAME, "w " * 32768))
    assert response.status_code == 400
    assert (
        "maximum context length is 32768 tokens. However, your request has 32768" in response.json()["error"]["message"]
    )


def test_metrics_have_vllm_names_and_labels(head: tuple[Standin, int]) -> None:
    """/metrics exposes the vllm: families with engine/model_name labels; generation_tokens advances."""
    _, port = head
    client = http("127.0.0.1", port)
    before = client.get("/metrics").text
    labels = {"engine": "0", "model_name": NAME}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:iteration_tokens_total_count",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):  # fmt: skip
        assert metric_value(before, name, **labels) is not None, name
    for reason in ("stop", "length", "abort", "error"):
        assert metric_value(before, "vllm:request_success_total", finished_reason=reason, **labels) is not None
    assert 'vllm:num_requests_running{engine="0",model_name="test-model"}' in before
    assert re.search(r'^vllm:cache_config_info\{block_size="16",.*engine="0".*\} 1\.0$', before, re.M)
    client.post("/v1/chat/completions", json=chat_body(NAME, max_tokens=7))
    after = client.get("/metrics").text
    generated = metric_value(after, "vllm:generation_tokens_total", **labels)
    assert (
        generated is not None and generated >= (metric_value(before, "vllm:generation_tokens_total", **labels) or 0) + 7
    )


STATS = (
    r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[loggers\.py:271\] Engine 000: Avg prompt throughput: \d+\.\d tokens/s, "
    r"Avg generation throughput: [1-9]\d*\.\d tokens/s, Running: \d+ reqs, Waiting: 0 reqs, "
    r"GPU KV cache usage: \d+\.\d%, Prefix cache hit rate: 0\.0%$"
)


def test_stats_line_only_when_not_idle(head: tuple[Standin, int]) -> None:
    """'Engine 000: Avg prompt throughput' is logged after traffic (interval 0.5 s here) and not while idle."""
    standin, port = head
    http("127.0.0.1", port).post("/v1/chat/completions", json=chat_body(NAME, max_tokens=50))
    standin.wait_for(r"^\(APIServer pid=\d+\) " + STATS, timeout=10)
    time.sleep(2.0)  # idle intervals: the first one after traffic still logs
    mark = len(standin.lines)
    time.sleep(1.5)
    assert not any("Engine 000" in line for line in standin.lines[mark:])


def test_disable_log_stats_removes_every_vllm_metric_and_the_stats_line(launch: Standins) -> None:
    """--disable-log-stats: vLLM builds no stat logger, so /metrics has no vllm:* family (the process collectors
    stay) and no stats line is logged, whatever the traffic."""
    port = free_port()
    standin = launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats",
                           env={"VLLM_LOG_STATS_INTERVAL": "0.3"})  # fmt: skip
    standin.wait_ready()
    client = http("127.0.0.1", port)
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 20}).status_code == 200
    text = client.get("/metrics").text
    assert "process_cpu_seconds_total" in text and "vllm:" not in text
    time.sleep(1.0)
    assert standin.count("Engine 000") == 0


def test_a_stale_vllm_keeps_answering_on_the_port_a_new_one_binds(launch: Standins) -> None:
    """vLLM binds its API socket with SO_REUSEADDR and SO_REUSEPORT: a second server on the port of a running one
    starts without EADDRINUSE, and while it loads, the old one answers every probe on that port."""
    port = free_port()
    stale = launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "stale")
    stale.wait_ready()
    fresh = launch.start("m", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "fresh",
                         startup_seconds=3.0)  # fmt: skip
    fresh.wait_for("Initializing a V1 LLM engine")
    assert fresh.count("Address already in use") == 0 and fresh.proc.poll() is None
    models = http("127.0.0.1", port).get("/v1/models").json()
    assert [card["id"] for card in models["data"]] == ["stale"]
    fresh.wait_ready()
    seen = {http("127.0.0.1", port).get("/v1/models").json()["data"][0]["id"] for _ in range(40)}
    assert seen == {"fresh", "stale"}  # both listen now; the kernel picks one per connection


def _start_with_real_titles(launch: Standins) -> Standin:
    """A ready tp=2 head titled VLLM::*. Supervisor tests on the same host sweep "stale" VLLM::* processes
    host-wide; an engine stopped from outside during startup (exit 0/-15/-9, never ours) is retried."""
    for _ in range(3):
        standin = launch.start("m", "--port", str(free_port()), "-tp", "2", title_prefix="VLLM")
        try:
            standin.wait_ready()
            return standin
        except AssertionError:
            if not re.search(r"Failed core proc\(s\): \{'EngineCore': (0|-15|-9)\}", standin.text()):
                raise
    pytest.fail("VLLM::* stand-ins kept being killed from outside (a concurrent stale-process sweep?)")


def test_children_have_vllm_titles_and_shm(launch: Standins) -> None:
    """EngineCore → Worker_TP0/TP1 by title (cmdline NUL-padded); psm_ segments and a sem.mp- file exist."""
    standin = _start_with_real_titles(launch)
    titled = standin.titled()
    assert set(titled) == {"VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1"}
    engine = titled["VLLM::EngineCore"]
    assert engine.ppid() == standin.pid
    assert {titled["VLLM::Worker_TP0"].ppid(), titled["VLLM::Worker_TP1"].ppid()} == {engine.pid}
    with open(f"/proc/{engine.pid}/cmdline", "rb") as cmdline:
        assert cmdline.read().startswith(b"VLLM::EngineCore\x00")
    assert psutil.Process(standin.pid).cmdline()[:3] == standin.argv[:3]  # the API server keeps its argv
    segments = {os.path.basename(p) for p in standin.shm_seen if re.search(r"/psm_[0-9a-f]{8}$", p)}
    assert len(segments) == 3  # the engine's broadcast ring + one response ring per worker
    assert all(os.path.exists(f"/dev/shm/{name}") for name in segments)
    assert any(path.startswith("/dev/shm/sem.") for path in standin.shm_seen)  # the executor's lock


def test_sigterm_after_ready_exits_0_and_removes_shm(launch: Standins) -> None:
    """SIGTERM when ready: 'Shutting down FastAPI HTTP server.', uvicorn's shutdown lines, children gone,
    psm_ segments unlinked, exit 0."""
    standin = launch.start("m", "--port", str(free_port()), "-tp", "2")
    standin.wait_ready()
    children = [p.pid for p in standin.tree()[1:]]
    segments = [p for p in standin.shm_seen if "/psm_" in p]
    assert len(segments) == 3
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == 0
    shutdown_lines = (
        "Shutting down FastAPI HTTP server.",
        "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
    )
    for line in shutdown_lines:
        standin.wait_for(re.escape(line), timeout=1)
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in children), timeout=10)
    assert not any(os.path.exists(path) for path in segments)


def _wait_for_workers(standin: Standin) -> list[int]:
    """PIDs of the EngineCore, both workers and the rest of the tree, once both ranks are initialising."""
    for rank in (0, 1):
        standin.wait_for(rf"world_size=2 rank={rank} ")
    return [p.pid for p in standin.tree()[1:]]


def test_sigterm_while_loading_ends_by_sigint(launch: Standins) -> None:
    """SIGTERM during load raises KeyboardInterrupt: children are stopped and the process dies by SIGINT."""
    standin = launch.start("m", "--port", str(free_port()), "-tp", "2", startup_seconds=10)
    children = _wait_for_workers(standin)
    standin.send(signal.SIGTERM)
    assert standin.wait_exit(30) == -signal.SIGINT
    standin.wait_for(r"KeyboardInterrupt: terminated", timeout=5)
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in children), timeout=10)


def test_sigterm_ignored_while_loading_with_knob(launch: Standins) -> None:
    """IGNORE_SIGTERM_WHILE_LOADING: SIGTERM has no effect; SIGKILL of the main process takes the children."""
    standin = launch.start(
        "m", "--port", str(free_port()), "-tp", "2", startup_seconds=10,
        env={"SPARKD_STANDIN_IGNORE_SIGTERM_WHILE_LOADING": "1"},
    )  # fmt: skip
    children = _wait_for_workers(standin)
    standin.send(signal.SIGTERM)
    time.sleep(1.0)
    assert standin.proc.poll() is None
    standin.send(signal.SIGKILL)
    assert standin.wait_exit(10) == -signal.SIGKILL
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in children), timeout=15)


def test_sigkill_leaves_orphans_only_with_knob(launch: Standins) -> None:
    """With ORPHAN_ON_KILL=1 a SIGKILLed API server leaves VLLM::EngineCore and VLLM::Worker behind."""
    standin = launch.start("m", "--port", str(free_port()), "-tp", "2",
                           env={"SPARKD_STANDIN_ORPHAN_ON_KILL": "1"})  # fmt: skip
    standin.wait_ready()
    children = [p.pid for p in standin.tree()[1:]]
    standin.send(signal.SIGKILL)
    assert standin.wait_exit(10) == -signal.SIGKILL
    time.sleep(1.5)
    survivors = [p for p in map(psutil.Process, children) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    titles = {f"{standin.title_prefix}::{name}" for name in ("EngineCore", "Worker_TP0", "Worker_TP1")}
    assert {p.cmdline()[0] for p in survivors} >= titles


def test_idle_threads_knob_gives_every_process_its_thread_pools(launch: Standins) -> None:
    """IDLE_THREADS=24: the API server, the EngineCore and each worker keep 24 more threads, idle, as torch's, NCCL's
    and CUDA's pools do in vLLM's processes (the benches' tree walks pay for each), and the ranks serve as before."""
    standin = launch.start("m", "--port", str(free_port()), "-tp", "2",
                           env={"SPARKD_STANDIN_IDLE_THREADS": "24"})  # fmt: skip
    standin.wait_ready()
    tree = standin.tree()
    titled = [tree[0], *(p for p in tree[1:] if p.cmdline()[0].startswith(f"{standin.title_prefix}::"))]
    assert len(titled) == 4  # the API server, the EngineCore, two workers (multiprocessing's tracker is no rank)
    assert all(p.num_threads() > 24 for p in titled), [(p.pid, p.num_threads()) for p in titled]


def test_uni_executor_api_key_and_eager(launch: Standins) -> None:
    """tp=1: the EngineCore loads the model itself (no worker process); --enforce-eager skips graph capture;
    --api-key guards /v1 only; VLLM_SERVER_DEV_MODE=1 adds the dev endpoints."""
    port = free_port()
    standin = launch.start(
        "m", "--port", str(port), "--host", "127.0.0.1", "--api-key", "sekret", "--enforce-eager",
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    standin.wait_ready()
    assert set(standin.titled()) == {f"{standin.title_prefix}::EngineCore"}
    standin.wait_for(r"^\(EngineCore pid=\d+\) INFO .* Loading weights took", timeout=1)
    assert standin.count("Capturing CUDA graphs") == 0 and standin.count("torch.compile") == 0
    client = http("127.0.0.1", port)
    assert client.get("/health").status_code == 200
    response = client.get("/v1/models")
    assert (response.status_code, response.json()) == (401, {"error": "Unauthorized"})
    assert client.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}
    standin.wait_for(r"Route: /is_sleeping, Methods: GET", timeout=1)


def test_api_port_in_use_fails_with_errno_98(launch: Standins) -> None:
    """A port held by a socket without SO_REUSEPORT (not a vLLM) ends the start with 'OSError: [Errno 98]
    Address already in use', exit 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        standin = launch.start("m", "--host", "127.0.0.1", "--port", str(holder.getsockname()[1]))
        assert standin.wait_exit(30) == 1
    standin.wait_for(r"OSError: \[Errno 98\] Address already in use")


def test_health_client_sees_no_loading_state(launch: Standins) -> None:
    """There is no 503-while-loading: connections fail until the first 200."""
    port = free_port()
    standin = launch.start("m", "--host", "127.0.0.1", "--port", str(port), startup_seconds=1.0)
    statuses = set()
    while standin.count("Application startup complete") == 0:
        try:
            statuses.add(httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code)
        except httpx.TransportError:
            statuses.add("refused")
        time.sleep(0.05)
    assert 503 not in statuses
    assert wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200)
