"""Startup progress: vLLM log lines → phases and facts; no clock."""

# The fixtures are vLLM log lines verbatim; wrapping them would change what is being parsed.
# ruff: noqa: E501

from __future__ import annotations

import pytest

from sparkd.supervisor.progress import PHASE_ORDER, Phase, Startup, advance, is_progress

CYAN, RESET = "\x1b[0;36m", "\x1b[0;0m"

# The head (node-rank 0) of a TP=2 pair on vLLM 0.13, as `docker logs` shows it: the API server's prefix is
# coloured (TTY), the worker inherits EngineCore's decoration until its own title is set after distributed
# init, tqdm bars redraw with \r, uvicorn lines have their own format.
HEAD_LOG = f"""\
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:01 [api_server.py:1351] vLLM API server version 0.13.0
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:01 [utils.py:253] non-default args: {{'model': '/models/DeepSeek-V4-Flash', 'tensor_parallel_size': 2, 'nnodes': 2, 'node_rank': 0, 'master_addr': '10.0.0.1', 'master_port': 29501}}
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:09 [model.py:514] Resolved architecture: DeepseekV4ForCausalLM
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:09 [model.py:1661] Using max model len 32768
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:09 [scheduler.py:231] Chunked prefill is enabled with max_num_batched_tokens=8192.
(EngineCore_DP0 pid=2301) INFO 11-26 01:20:15 [core.py:94] Initializing a V1 LLM engine (v0.13.0) with config: model='/models/DeepSeek-V4-Flash', speculative_config=None, tensor_parallel_size=2
(EngineCore_DP0 pid=2301) WARNING 11-26 01:20:15 [multiproc_executor.py:883] Reducing Torch parallelism from 20 threads to 1 to avoid unnecessary CPU contention.
(EngineCore_DP0 pid=2301) INFO 11-26 01:20:21 [parallel_state.py:1204] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.0.0.1:29501 backend=nccl
(Worker_TP0 pid=2390) INFO 11-26 01:20:48 [pynccl.py:112] vLLM is using nccl==2.27.3
(Worker_TP0 pid=2390) INFO 11-26 01:20:49 [parallel_state.py:1412] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, EP rank 0
(Worker_TP0 pid=2390) INFO 11-26 01:20:50 [gpu_model_runner.py:3563] Starting to load model /models/DeepSeek-V4-Flash...
(Worker_TP0 pid=2390) INFO 11-26 01:20:51 [cuda.py:352] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN']
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards:  25% Completed | 1/4 [00:40<02:00, 40.00s/it]
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards:  50% Completed | 2/4 [01:20<01:20, 40.00s/it]
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards:  75% Completed | 3/4 [02:00<00:40, 40.00s/it]
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards: 100% Completed | 4/4 [02:40<00:00, 40.00s/it]
(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards: 100% Completed | 4/4 [02:40<00:00, 40.00s/it]
(Worker_TP0 pid=2390)
(Worker_TP0 pid=2390) INFO 11-26 01:23:31 [default_loader.py:309] Loading weights took 160.12 seconds
(Worker_TP0 pid=2390) INFO 11-26 01:23:32 [gpu_model_runner.py:3660] Model loading took 71.2345 GiB memory and 161.345678 seconds
(Worker_TP0 pid=2390) INFO 11-26 01:23:40 [backends.py:644] Using cache directory: /root/.cache/vllm/torch_compile_cache/3f2a/rank_0_0/backbone for vLLM's torch.compile
(Worker_TP0 pid=2390) INFO 11-26 01:23:41 [backends.py:704] Dynamo bytecode transform time: 5.12 s
(Worker_TP0 pid=2390) INFO 11-26 01:24:01 [monitor.py:35] torch.compile takes 25.3 s in total
(Worker_TP0 pid=2390) INFO 11-26 01:24:10 [gpu_worker.py:376] Available KV cache memory: 18.08 GiB
(EngineCore_DP0 pid=2301) INFO 11-26 01:24:11 [kv_cache_utils.py:1291] GPU KV cache size: 327,680 tokens
(EngineCore_DP0 pid=2301) INFO 11-26 01:24:11 [kv_cache_utils.py:1297] Maximum concurrency for 32,768 tokens per request: 10.00x
(Worker_TP0 pid=2390) \rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/67 [00:00<?, ?it/s]\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  49%|████▉     | 33/67 [00:02<00:02, 14.20it/s]\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:04<00:00, 15.10it/s]
(Worker_TP0 pid=2390) \rCapturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:01<00:00, 20.00it/s]
(Worker_TP0 pid=2390) INFO 11-26 01:24:20 [gpu_model_runner.py:4588] Graph capturing finished in 5 secs, took 0.52 GiB
(EngineCore_DP0 pid=2301) INFO 11-26 01:24:21 [core.py:260] init engine (profile, create kv cache, warmup model) took 45.67 seconds
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:24:23 [api_server.py:1099] Supported tasks: ['generate']
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:24:23 [api_server.py:1426] Starting vLLM API server 0 on http://0.0.0.0:8000
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:24:23 [launcher.py:38] Available routes are:
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:24:23 [launcher.py:46] Route: /health, Methods: GET
{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:24:23 [launcher.py:46] Route: /v1/models, Methods: GET
{CYAN}(APIServer pid=2172){RESET} INFO:     Started server process [2172]
{CYAN}(APIServer pid=2172){RESET} INFO:     Waiting for application startup.
{CYAN}(APIServer pid=2172){RESET} INFO:     Application startup complete.
{CYAN}(APIServer pid=2172){RESET} INFO:     10.0.0.5:43002 - "GET /health HTTP/1.1" 200 OK
"""

# The headless worker (node-rank 1): its main process is not decorated, the worker only after distributed
# init; the TCPStore client retries while the head is still booting; no KV-cache-size, API or uvicorn lines.
WORKER_LOG = """\
INFO 11-26 01:19:58 [serve.py:121] Launching vLLM (v0.13.0) headless multiproc executor, with head node address 10.0.0.1:29501 for torch.distributed process group.
WARNING 11-26 01:19:58 [multiproc_executor.py:883] Reducing Torch parallelism from 20 threads to 1 to avoid unnecessary CPU contention.
INFO 11-26 01:20:03 [parallel_state.py:1204] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.0.0.1:29501 backend=nccl
[W1126 01:20:04.123456 811 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 10.0.0.1:29501 - retrying (try=0, timeout=600000ms, delay=1000ms): Connection refused
[W1126 01:20:14.123456 811 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 10.0.0.1:29501 - retrying (try=1, timeout=600000ms, delay=2000ms): Connection refused
(Worker_TP1 pid=811) INFO 11-26 01:20:48 [pynccl.py:112] vLLM is using nccl==2.27.3
(Worker_TP1 pid=811) INFO 11-26 01:20:49 [parallel_state.py:1412] rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 1, EP rank 1
(Worker_TP1 pid=811) INFO 11-26 01:23:29 [default_loader.py:309] Loading weights took 158.40 seconds
(Worker_TP1 pid=811) INFO 11-26 01:23:30 [gpu_model_runner.py:3660] Model loading took 71.2 GiB memory and 159.012345 seconds
(Worker_TP1 pid=811) INFO 11-26 01:23:41 [backends.py:704] Dynamo bytecode transform time: 5.30 s
(Worker_TP1 pid=811) INFO 11-26 01:24:10 [gpu_worker.py:376] Available KV cache memory: 18.10 GiB
(Worker_TP1 pid=811) INFO 11-26 01:24:20 [gpu_model_runner.py:4588] Graph capturing finished in 5 secs, took 0.52 GiB
"""


def replay(log: str, start: Startup | None = None) -> list[Startup]:
    """Feed each line at t = its line number; return the progress after every line."""
    progress = start or Startup()
    out = []
    for t, line in enumerate(log.split("\n")):
        progress = advance(progress, line, float(t))
        out.append(progress)
    return out


def phases(states: list[Startup]) -> list[Phase]:
    seen: list[Phase] = []
    for p in states:
        if not seen or seen[-1] is not p.phase:
            seen.append(p.phase)
    return seen


def test_head_log_walks_every_phase_in_order() -> None:
    """A full head boot goes launching → … → ready, one phase at a time."""
    assert phases(replay(HEAD_LOG)) == list(PHASE_ORDER)


def test_head_log_facts() -> None:
    """The facts a head boot reports are extracted with their units."""
    states = replay(HEAD_LOG)
    final = states[-1]
    assert final.phase is Phase.ready
    assert (final.shards_loaded, final.shards_total) == (4, 4)
    assert final.model_loading_gib == 71.2345 and final.model_loading_s == 161.345678
    assert final.kv_cache_gib == 18.08
    assert final.kv_cache_tokens == 327_680
    assert (final.max_concurrency_tokens, final.max_concurrency) == (32_768, 10.0)
    assert (final.world_size, final.rank) == (2, 0)
    assert final.distributed_ready
    # The last line that meant progress is "Application startup complete." — not the access-log line after it.
    lines = HEAD_LOG.split("\n")
    assert final.last_progress_at == float(next(i for i, s in enumerate(lines) if "startup complete" in s))


def test_head_distributed_ready_comes_with_the_rank_line() -> None:
    """distributed_ready flips exactly at "rank N in world size M is assigned as"."""
    states = replay(HEAD_LOG)
    lines = HEAD_LOG.split("\n")
    first = next(i for i, p in enumerate(states) if p.distributed_ready)
    assert "is assigned as" in lines[first]
    assert states[first - 1].phase is Phase.waiting_for_peer


def test_shard_progress_is_tracked_frame_by_frame() -> None:
    """Each tqdm frame of the shard bar updates the shard count."""
    counts = [(p.shards_loaded, p.shards_total) for p in replay(HEAD_LOG) if p.shards_loaded is not None]
    assert sorted(set(counts)) == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


def test_worker_log_phases_and_facts() -> None:
    """A headless worker waits for the peer, loads, sizes its KV cache, captures graphs; never ready."""
    states = replay(WORKER_LOG)
    # The first line is the headless launch line: the worker is waiting for its peer from the start.
    assert phases(states) == [Phase.waiting_for_peer, Phase.loading_weights, Phase.compiling, Phase.kv_cache,
                              Phase.graph_capture]
    final = states[-1]
    assert final.distributed_ready
    assert (final.world_size, final.rank) == (2, 1)
    assert final.model_loading_gib == 71.2 and final.kv_cache_gib == 18.10
    assert final.kv_cache_tokens is None and final.max_concurrency is None  # EngineCore lives on the head


def test_worker_retries_are_not_progress() -> None:
    """The TCPStore client's retry warnings change nothing: the same object comes back."""
    lines = WORKER_LOG.split("\n")
    waiting = replay("\n".join(lines[:3]))[-1]
    assert waiting.phase is Phase.waiting_for_peer and not waiting.distributed_ready
    for retry in lines[3:5]:
        assert advance(waiting, retry, 99.0) is waiting


@pytest.mark.parametrize(
    "line",
    [
        "(Worker_TP1 pid=811) INFO 11-26 01:23:29 [default_loader.py:309] Loading weights took 158.40 seconds",
        "INFO 11-26 01:23:30 [gpu_model_runner.py:3660] Model loading took 71.2 GiB memory and 159.0 seconds",
        "INFO 11-26 01:20:49 [parallel_state.py:1412] rank 1 in world size 2 is assigned as DP rank 0, TP rank 1",
    ],
)
def test_distributed_ready_on_a_headless_node(line: str) -> None:
    """Any of these lines proves the rank got past torch.distributed init."""
    waiting = Startup(phase=Phase.waiting_for_peer)
    assert advance(waiting, line, 1.0).distributed_ready


@pytest.mark.parametrize(
    ("line", "tokens", "concurrency", "per_request"),
    [
        ("INFO 11-26 01:24:11 [kv_cache_utils.py:1291] GPU KV cache size: 327,680 tokens", 327_680, None, None),
        (
            "INFO 11-26 01:24:11 [kv_cache_utils.py:1297] Maximum concurrency for 32,768 tokens per request: 10.00x",
            None,
            10.0,
            32_768,
        ),
        # ≥0.28: one line
        (
            "(EngineCore pid=9) INFO 11-26 01:24:11 [kv_cache_utils.py:1301] GPU KV cache size: 2,044,166 tokens, "
            "Maximum concurrency for 1,048,576 tokens per request: 1.95x",
            2_044_166,
            1.95,
            1_048_576,
        ),
        (
            "GPU KV cache size: 1,901,239 tokens,Maximum concurrency for 1,048,576 tokens per request: 1.81x",
            1_901_239,
            1.81,
            1_048_576,
        ),
    ],
)
def test_kv_cache_lines(line: str, tokens: int | None, concurrency: float | None, per_request: int | None) -> None:
    """Separate and merged KV-cache/concurrency lines, commas in the numbers."""
    p = advance(Startup(), line, 1.0)
    assert p.phase is Phase.kv_cache
    assert (p.kv_cache_tokens, p.max_concurrency, p.max_concurrency_tokens) == (tokens, concurrency, per_request)


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        ("vLLM server version 0.20.0, serving model /models/x", Phase.launching),
        (
            "Launching vLLM (v0.33.0) headless multiproc executor, with head node address 10.0.0.1:29501 for "
            "torch.distributed process group.",
            Phase.waiting_for_peer,
        ),
        (
            "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.0.0.1:29501 backend=nccl",
            Phase.waiting_for_peer,
        ),
        ("Starting to load model /models/x...", Phase.loading_weights),
        ("Loading weights took 12.34 seconds", Phase.loading_weights),
        ("Model loading took 30.12 GiB memory and 13.456789 seconds", Phase.compiling),
        ("Dynamo bytecode transform time: 5.1 s", Phase.compiling),
        ("Available KV cache memory: 40.12 GiB", Phase.kv_cache),
        ("Capturing CUDA graphs (decode, FULL): 100%|██████████| 67/67 [00:04<00:00]", Phase.graph_capture),
        ("Graph capturing finished in 5 secs, took 0.52 GiB", Phase.graph_capture),
        ("init engine (profile, create kv cache, warmup model) took 45.67 seconds", Phase.api_starting),
        (
            "init engine (profile, create kv cache, warmup model) took 45.67 s (compilation: 25.30 s)",
            Phase.api_starting,
        ),
        ("Starting vLLM API server 0 on http://0.0.0.0:8000", Phase.api_starting),
        ("Starting vLLM server on http://0.0.0.0:8000", Phase.api_starting),  # 0.18+
        ("INFO:     Application startup complete.", Phase.ready),
    ],
)
def test_each_phase_line(line: str, phase: Phase) -> None:
    """Each landmark line lands in its phase, from the start, with or without decoration."""
    for decorated in (line, f"{CYAN}(APIServer pid=1){RESET} {line}", f"(Worker_TP1 pid=7) {line}"):
        p = advance(Startup(), decorated, 5.0)
        assert p.phase is phase, decorated
        assert p.last_progress_at == 5.0
        assert is_progress(decorated)


def test_phases_only_move_forward() -> None:
    """A late shard line is progress, but the phase stays where it was."""
    at_kv = Startup(phase=Phase.kv_cache, kv_cache_tokens=10)
    p = advance(at_kv, "Loading safetensors checkpoint shards: 100% Completed | 4/4 [02:40<00:00]", 7.0)
    assert p.phase is Phase.kv_cache
    assert (p.shards_loaded, p.last_progress_at) == (4, 7.0)


def test_tqdm_carriage_returns_take_the_last_frame() -> None:
    """Several frames in one line: the last one is the state."""
    line = (
        "(Worker_TP0 pid=2390) \rLoading safetensors checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]"
        "\rLoading safetensors checkpoint shards:  38% Completed | 3/8 [01:00<01:40, 20.0s/it]\r"
    )
    p = advance(Startup(), line, 3.0)
    assert (p.phase, p.shards_loaded, p.shards_total) == (Phase.loading_weights, 3, 8)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\r",
        "(APIServer pid=2172) INFO 11-26 01:20:09 [model.py:1661] Using max model len 32768",
        '(APIServer pid=2172) INFO:     10.0.0.5:43002 - "GET /health HTTP/1.1" 200 OK',
        "INFO 11-26 01:30:00 [loggers.py:209] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        "throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%",
        "INFO 11-26 01:30:00 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds.",
        "(APIServer pid=2172) INFO 11-26 01:24:23 [launcher.py:46] Route: /health, Methods: GET",
    ],
)
def test_lines_that_are_not_progress_return_the_same_object(line: str) -> None:
    """Unrecognised lines change nothing, not even last_progress_at."""
    p = Startup(phase=Phase.loading_weights, last_progress_at=1.0)
    assert advance(p, line, 50.0) is p
    assert not is_progress(line)


def test_identical_progress_at_the_same_time_returns_the_same_object() -> None:
    """A repeated line at the same instant changes nothing."""
    line = "Loading safetensors checkpoint shards: 100% Completed | 4/4 [02:40<00:00, 40.00s/it]"
    p = advance(Startup(), line, 3.0)
    assert advance(p, line, 3.0) is p
    assert advance(p, line, 4.0).last_progress_at == 4.0


def test_phase_order_is_the_startup_sequence() -> None:
    """PHASE_ORDER lists the phases in startup order and order is its index."""
    assert [p.order for p in PHASE_ORDER] == list(range(len(PHASE_ORDER)))
    assert PHASE_ORDER[0] is Phase.launching and PHASE_ORDER[-1] is Phase.ready
