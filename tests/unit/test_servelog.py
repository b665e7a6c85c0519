"""vLLM's serving-time log lines: the periodic throughput line (0.11–0.24 formats) and the JIT-compile lines, read
from real lines (sources in each case)."""

from __future__ import annotations

import pytest

from sparkd.supervisor.servelog import JitCompile, ShmWait, Throughput, read_serve_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # vllm#30599 (v0.12.0)
        ("(APIServer pid=1) INFO 12-11 20:30:16 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
         "Avg generation throughput: 181.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.6%, "
         "Prefix cache hit rate: 68.2%", Throughput("000", 0.0, 181.0, 1, 0, 0.6)),
        # vllm#48752 (a wedge: the last INFO line with zero throughput and requests running)
        ("(APIServer pid=605) INFO 07-15 15:32:57 [loggers.py:273] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
         "Avg generation throughput: 0.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.7%, "
         "Prefix cache hit rate: 0.0%, Corrupted: 0 reqs", Throughput("000", 0.0, 0.0, 3, 0, 0.7)),
        # vllm#16580 (V1 with two engines): engine 001 is its own line
        ("INFO 04-14 08:14:17 [loggers.py:87] Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation "
         "throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit "
         "rate: 0.0%", Throughput("001", 0.0, 0.0, 0, 0, 0.0)),
        # vllm#2731 (a 2024 V0 engine, before 0.11: another format, not read)
        ("INFO 02-01 06:36:05 llm_engine.py:921] Avg prompt throughput: 382.6 tokens/s, Avg generation throughput: "
         "118.5 tokens/s, Max iteration time: 386.7 ms, Avg time/tok:149.4 ms, Running: 35 reqs, Swapped: 0 reqs, "
         "Pending: 115 reqs, GPU KV cache usage: 99.0%, CPU KV cache usage: 0.0%", None),
    ],
)
def test_throughput_line(line: str, expected: Throughput | None) -> None:
    assert read_serve_line(line) == expected


@pytest.mark.parametrize(
    ("line", "what"),
    [
        # vllm#43009
        ("(EngineCore) WARNING 05-18 19:12:27 [jit_monitor.py:103] Triton kernel JIT compilation during inference: "
         "_causal_conv1d_update_kernel. This causes a latency spike; consider extending warmup to cover this "
         "shape/config.", "Triton kernel _causal_conv1d_update_kernel"),
        # vllm PR #46167
        ("(EngineCore pid=2275828) WARNING 06-19 16:22:25 [jit_monitor.py:124] CuTeDSL JIT compilation during "
         "inference: FlashAttentionForwardSm100. This causes a latency spike; consider extending warmup to cover "
         "this shape/config.", "CuTeDSL FlashAttentionForwardSm100"),
        # vllm PR #46718
        ("WARNING 06-25 10:59:52 [jit_monitor.py:134] TileLang JIT compilation during inference: "
         "mhc_pre_big_fuse_with_norm_tilelang. This causes a latency spike; consider extending warmup to cover this "
         "shape/config.", "TileLang mhc_pre_big_fuse_with_norm_tilelang"),
        # eugr/spark-vllm-docker PR #367 (FlashInfer's own logger)
        ("(Worker_TP0 pid=511) 2026-09-02 11:57:03,500 - INFO - autotuner.py:829 - flashinfer.jit: [Autotuner]: "
         "Autotuning process starts ...", "flashinfer.jit: [Autotuner]: Autotuning process starts ..."),
    ],
)
def test_jit_line(line: str, what: str) -> None:
    assert read_serve_line(line) == JitCompile(what)


@pytest.mark.parametrize(("line", "seconds"), [
    # eugr/spark-vllm-docker#348 (a 0.23 build)
    ("(EngineCore pid=222) INFO 08-15 11:16:19 [shm_broadcast.py:705] No available shared memory broadcast block "
     "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work "
     "(e.g. compilation, weight/kv cache quantization).", 60),
    # VLLM_RINGBUFFER_WARNING_INTERVAL=20, with 0.11's wording (shm_broadcast.py, line 398 of 0.11.0)
    ("(EngineCore_DP0 pid=88) INFO 01-07 09:00:00 [shm_broadcast.py:398] No available shared memory broadcast block "
     "found in 20 seconds. This typically happens when some processes are hanging or doing some time-consuming work "
     "(e.g. compilation)", 20),
])
def test_executor_wait_line(line: str, seconds: int) -> None:
    assert read_serve_line(line) == ShmWait(seconds)


@pytest.mark.parametrize("line", [
    "No available shared memory broadcast block found in 0 seconds.",
    "(APIServer pid=1) INFO:     127.0.0.1:39830 - \"GET /health HTTP/1.1\" 200 OK",
    "(Worker_TP0 pid=129) INFO 07-05 17:28:31 [jit_monitor.py:60] Kernel JIT monitor activated — Triton JIT "
    "compilations during inference will be logged as warnings.",
])
def test_other_lines_say_nothing(line: str) -> None:
    assert read_serve_line(line) is None
