"""The stand-in speaks the vLLM release it is told to (SPARKD_STANDIN_VLLM_VERSION, default 0.21.0): each release's
lines, file:line headers, process prefixes (stacked under fork in 0.13, replaced in 0.21+), colours and titles,
as read from the 0.13.0, 0.21.0 and 0.24.0 sources. Real processes; each test cleans up what it started."""

from __future__ import annotations

import re

import httpx
import pytest
from freeport import free_port
from standin_helpers import Standin, Standins, http, wait_until

MODEL = "/models/Qwen3-30B"
A, E, W = r"\(APIServer pid=\d+\) ", r"\(EngineCore_DP0 pid=\d+\) ", r"\(Worker_TP0 pid=\d+\) "
HEAD = r"INFO \d\d-\d\d \d\d:\d\d:\d\d "

# (version, env) -> the lines, in order, of a tp=2 head started with MODEL and --max-model-len 32K
STARTUP = {
    "0.13.0": [
        rf"^{A}{HEAD}\[api_server\.py:1351\] vLLM API server version 0\.13\.0$",
        rf"^{A}{HEAD}\[utils\.py:253\] non-default args: \{{'model_tag': '{MODEL}'",
        rf"^{A}{E}{HEAD}\[core\.py:93\] Initializing a V1 LLM engine \(v0\.13\.0\)",
        rf"^{A}{E}{HEAD}\[parallel_state\.py:1203\] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://",
        rf"^{A}{E}{HEAD}\[parallel_state\.py:1411\] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, "
        r"PCP rank 0, TP rank 0, EP rank 0$",
        rf"^{A}{E}{W}{HEAD}\[gpu_model_runner\.py:3562\] Starting to load model {MODEL}\.\.\.$",
        rf"^{A}{E}{W}{HEAD}\[gpu_model_runner\.py:3659\] Model loading took \d+\.\d{{4}} GiB memory and [\d.]+ seconds",
        rf"^{A}{E}{W}{HEAD}\[monitor\.py:34\] torch\.compile takes [\d.]+ s in total$",
        rf"^{A}{E}{HEAD}\[kv_cache_utils\.py:1291\] GPU KV cache size: [\d,]+ tokens$",
        rf"^{A}{E}{HEAD}\[core\.py:259\] init engine \(profile, create kv cache, warmup model\) took [\d.]+ seconds$",
        rf"^{A}{HEAD}\[api_server\.py:1425\] Starting vLLM API server 0 on http://127\.0\.0\.1:\d+$",
        rf"^{A}{HEAD}\[launcher\.py:38\] Available routes are:$",
    ],
    "0.21.0": [
        rf"^{A}{HEAD}\[utils\.py:306\] $",
        rf"^{A}{HEAD}\[utils\.py:306\]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0\.21\.0$",
        rf"^{A}{HEAD}\[utils\.py:306\]   █▄█▀ █     █     █     █  model   {MODEL}$",
        rf"^{A}{HEAD}\[utils\.py:240\] non-default args: \{{'model_tag': '{MODEL}'",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[core\.py:109\] Initializing a V1 LLM engine \(v0\.21\.0\)",
        rf"^\(Worker pid=\d+\) {HEAD}\[parallel_state\.py:1410\] world_size=2 rank=0 local_rank=0 ",
        rf"^\(Worker pid=\d+\) {HEAD}\[parallel_state\.py:1723\] rank 0 in world size 2 is assigned as DP rank 0, "
        r"PP rank 0, PCP rank 0, TP rank 0, EP rank N/A, EPLB rank N/A$",
        rf"^{W}{HEAD}\[gpu_model_runner\.py:4857\] Starting to load model {MODEL}\.\.\.$",
        rf"^{W}Loading safetensors checkpoint shards:  50% Completed \| 2/4 \[",
        rf"^{W}{HEAD}\[default_loader\.py:397\] Loading weights took [\d.]+ seconds$",
        rf"^{W}{HEAD}\[gpu_model_runner\.py:4959\] Model loading took \d+\.\d{{1,2}} GiB memory and "
        r"\d+\.\d{6} seconds$",
        rf"^{W}{HEAD}\[monitor\.py:53\] torch\.compile took [\d.]+ s in total$",
        rf"^{W}{HEAD}\[gpu_worker\.py:462\] Available KV cache memory: [\d.]+ GiB$",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[kv_cache_utils\.py:1710\] GPU KV cache size: [\d,]+ tokens$",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[kv_cache_utils\.py:1711\] Maximum concurrency for 32,768 tokens per request",
        rf"^{W}Capturing CUDA graphs \(mixed prefill-decode, PIECEWISE\): 100%",
        rf"^{W}{HEAD}\[gpu_model_runner\.py:6243\] Graph capturing finished in \d+ secs, took 0\.52 GiB$",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[core\.py:299\] init engine \(profile, create kv cache, warmup model\) "
        r"took [\d.]+ s \(compilation: [\d.]+ s\)$",
        rf"^{A}{HEAD}\[api_server\.py:613\] Supported tasks: \['generate'\]$",
        rf"^{A}{HEAD}\[api_server\.py:617\] Starting vLLM server on http://127\.0\.0\.1:\d+$",
        rf"^{A}{HEAD}\[launcher\.py:37\] Available routes are:$",
        rf"^{A}{HEAD}\[launcher\.py:46\] Route: /health, Methods: GET$",
        r"^\(APIServer pid=(\d+)\) INFO:     Started server process \[\1\]$",
        rf"^{A}INFO:     Application startup complete\.$",
    ],
    "0.24.0": [
        rf"^{A}{HEAD}\[api_utils\.py:339\]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0\.24\.0$",
        rf"^{A}{HEAD}\[api_utils\.py:273\] non-default args: ",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[core\.py:114\] Initializing a V1 LLM engine \(v0\.24\.0\)",
        rf"^\(Worker pid=\d+\) {HEAD}\[parallel_state\.py:1588\] world_size=2 rank=0 ",
        rf"^{W}{HEAD}\[gpu_model_runner\.py:5255\] Model loading took [\d.]+ GiB memory and",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[kv_cache_utils\.py:2146\] GPU KV cache size: [\d,]+ tokens$",
        rf"^{W}{HEAD}\[jit_monitor\.py:60\] Kernel JIT monitor activated — Triton JIT compilations during "
        r"inference will be logged as warnings\.$",
        rf"^\(EngineCore pid=\d+\) {HEAD}\[core\.py:337\] init engine \(profile, create kv cache, warmup model\) "
        r"took [\d.]+ s \(compilation: [\d.]+ s\)$",
        rf"^{A}{HEAD}\[api_server\.py:581\] Starting vLLM server on http://127\.0\.0\.1:\d+$",
    ],
}


STATS_AT = {"0.13.0": "loggers.py:248", "0.21.0": "loggers.py:271", "0.24.0": "loggers.py:273"}


def _head(launch: Standins, version: str, *extra: str, port: int | None = None, **env: str) -> Standin:
    return launch.start(
        MODEL, "--host", "127.0.0.1", "--port", str(port or free_port()), "-tp", "2", "--max-model-len", "32K",
        *extra, env={"SPARKD_STANDIN_VLLM_VERSION": version, "NO_COLOR": "1", **env},
    )  # fmt: skip


def assert_in_order(standin: Standin, patterns: list[str]) -> None:
    position = 0
    for pattern in patterns:
        standin.wait_for(pattern, timeout=5, start=position)
        regex = re.compile(pattern)
        position = next(i for i in range(position, len(standin.lines)) if regex.search(standin.lines[i])) + 1


@pytest.mark.parametrize("version", sorted(STARTUP))
def test_startup_lines_are_each_releases_own(launch: Standins, version: str) -> None:
    """A tp=2 head logs the release's lines in vLLM's order, from the right process, with its file:line; so is
    its stats line once there is traffic."""
    port = free_port()
    standin = _head(launch, version, port=port, VLLM_LOG_STATS_INTERVAL="0.5")
    standin.wait_ready()
    assert_in_order(standin, STARTUP[version])
    wait_until(lambda: _completed(port))
    standin.wait_for(
        rf"^{A}{HEAD}\[{re.escape(STATS_AT[version])}\] Engine 000: Avg prompt throughput: \d+\.\d tokens/s, Avg "
        r"generation throughput: \d+\.\d tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: "
        r"\d+\.\d%, Prefix cache hit rate: 0\.0%$",
        timeout=10,
    )
    text = standin.text()
    assert "Uvicorn running on" not in text
    assert re.search(r"\(Worker_TP1 pid=\d+\) .*Loading weights took", text) is None  # info_once: local rank 0
    assert ("Engine core proc" in text, "vLLM API server version" in text) == (False, version == "0.13.0")


def _completed(port: int) -> bool:
    try:
        response = http("127.0.0.1", port).post("/v1/completions", json={"prompt": "hi", "max_tokens": 8})
    except httpx.TransportError:
        return False  # uvicorn listens just after "Application startup complete."
    return response.status_code == 200


def test_013_without_fork_decorates_each_process_once(launch: Standins) -> None:
    """VLLM_WORKER_MULTIPROC_METHOD=spawn: nothing is inherited, every process carries only its own name."""
    standin = _head(launch, "0.13.0", VLLM_WORKER_MULTIPROC_METHOD="spawn")
    standin.wait_ready()
    standin.wait_for(rf"^{E}{HEAD}\[core\.py:93\] Initializing a V1 LLM engine", timeout=1)
    standin.wait_for(rf"^{W}{HEAD}\[gpu_model_runner\.py:3562\] Starting to load model", timeout=1)
    standin.wait_for(rf"^{HEAD}\[parallel_state\.py:1203\] world_size=2 rank=0", timeout=1)  # before its own name


@pytest.mark.parametrize(
    ("version", "env", "coloured"),
    [
        ("0.13.0", {}, True),  # 0.13 colours the prefix unless NO_COLOR, terminal or not
        ("0.13.0", {"NO_COLOR": "1"}, False),
        ("0.21.0", {}, False),  # 0.21+: only on a terminal, or with VLLM_LOGGING_COLOR=1
        ("0.21.0", {"VLLM_LOGGING_COLOR": "1"}, True),
    ],
)
def test_prefix_colour_follows_the_release(launch: Standins, version: str, env: dict[str, str], coloured: bool) -> None:
    standin = launch.start("m", "--host", "127.0.0.1", "--port", str(free_port()), "--enforce-eager",
                           env={"SPARKD_STANDIN_VLLM_VERSION": version, **env})  # fmt: skip
    standin.wait_ready()
    assert (f"\x1b[0;36m(APIServer pid={standin.pid})\x1b[0;0m ".encode() in standin.raw) is coloured
    assert f"(APIServer pid={standin.pid}) ".encode() in standin.raw or coloured


@pytest.mark.parametrize(
    ("version", "env", "title"),
    [
        ("0.21.0", {}, "Worker"),  # 0.21+ titles a worker before it knows its rank
        ("0.13.0", {}, "EngineCore"),  # 0.13 under fork: the parent's title until the rendezvous is done
        ("0.13.0", {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, None),  # spawn: multiprocessing's own command line
    ],
)
def test_worker_title_while_it_waits_for_its_peer(
    launch: Standins, version: str, env: dict[str, str], title: str | None
) -> None:
    """A head of a two-node world whose worker node never comes: its Worker_TP0 waits in the rendezvous."""
    standin = launch.start(
        "m", "--port", str(free_port()), "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), env={"SPARKD_STANDIN_VLLM_VERSION": version, **env}, startup_seconds=5,
    )  # fmt: skip
    standin.wait_for(r"world_size=2 rank=0 ")
    engine_title = f"{standin.title_prefix}::EngineCore"
    engine = wait_until(
        lambda: [p for p in standin.tree()[1:] if p.ppid() == standin.pid and p.cmdline()[0] == engine_title]
    )[0]
    worker = wait_until(lambda: [p for p in engine.children() if "resource_tracker" not in " ".join(p.cmdline())])[0]
    if title is None:
        assert "multiprocessing.spawn" in " ".join(worker.cmdline())
    else:
        assert worker.cmdline()[0] == f"{standin.title_prefix}::{title}"
