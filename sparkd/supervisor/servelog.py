"""What vLLM's log says while it serves: its periodic throughput line, the executor's wait line and the JIT-compile
lines. Pure.

The throughput line (``v1/metrics/loggers.py`` ``LoggingStatLogger.log``, every ``VLLM_LOG_STATS_INTERVAL`` =
10 s, 0.11–0.24)::

    Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 33.2 tokens/s, Running: 1 reqs,
    Waiting: 0 reqs, GPU KV cache usage: 58.5%, Prefix cache hit rate: 76.5%

Rules that matter to a stall check (checked against vLLM 0.13 and 0.24 source):

- It is logged at INFO only while the engine is not idle: once both throughputs were 0 for two intervals in a
  row it drops to DEBUG, so the lines stop. A wedge mid-generation therefore leaves one last line with
  ``0.0 tokens/s`` and ``Running: N`` > 0, then silence.
- ``Running``/``Waiting`` come from the scheduler stats of the last *completed* engine step, like the
  ``vllm:num_requests_*`` gauges: a step that never completes changes neither.
- Prompt tokens are counted when a request's prefill finishes (its first token), so a long chunked prefill shows
  0 prompt throughput until it is done; only the KV cache usage moves.
- ``--disable-log-stats`` turns these lines off together with every ``vllm:*`` metric (both are the stat
  logger manager ``AsyncLLM`` only builds with log stats on).

The executor's wait line (``shm_broadcast.py``, 0.11–0.24), written by the EngineCore of a multiprocess executor
(TP ≥ 2) every ``VLLM_RINGBUFFER_WARNING_INTERVAL`` (60) seconds while it waits for a worker's answer to one
engine step (``collective_rpc`` → ``MessageQueue.dequeue``; the workers' own idle wait is ``indefinite`` and
silent). It does not depend on ``--disable-log-stats``::

    (EngineCore pid=222) INFO 08-15 11:16:19 [shm_broadcast.py:705] No available shared memory broadcast block
        found in 60 seconds. This typically happens when some processes are hanging or doing some
        time-consuming work (e.g. compilation, weight/kv cache quantization).

JIT lines (real ones, from vLLM's ``jit_monitor.py`` ≥0.21 and FlashInfer's ``flashinfer.jit`` logger)::

    (EngineCore) WARNING 05-18 19:12:27 [jit_monitor.py:103] Triton kernel JIT compilation during inference:
        _causal_conv1d_update_kernel. This causes a latency spike; consider extending warmup to cover ...
    (EngineCore pid=2275828) WARNING 06-19 16:22:25 [jit_monitor.py:124] CuTeDSL JIT compilation during
        inference: FlashAttentionForwardSm100. ...
    WARNING 06-25 10:59:52 [jit_monitor.py:134] TileLang JIT compilation during inference: mhc_pre_big_...
    2025-03-10 10:41:52,925 - INFO - flashinfer.jit: Prebuilt kernels not found, using JIT backend

The jit_monitor lines are written *after* each compile (a Triton post-compile hook), so a burst of compiles
shows as a line per kernel; DeepGEMM's and FlashInfer's runtime compiles log nothing by default (vllm#49905,
vllm#56684; the FlashInfer logging PRs #38462/#54529 are not merged), so sparkd does not see them: such a compile
longer than the busy limit reads as a wedge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.supervisor.logline import clean

__all__ = ["JitCompile", "ShmWait", "Throughput", "read_serve_line"]

@dataclass(frozen=True)
class Throughput:
    """One engine's periodic throughput line."""

    engine: str  # "000"
    prompt_tps: float
    generation_tps: float
    running: int
    waiting: int
    kv_cache_usage_pct: float | None  # "GPU KV cache usage: 58.5%" ("CPU KV cache usage" on vLLM's CPU build)

    @property
    def moving(self) -> bool:
        """The engine completed steps that processed tokens during the interval."""
        return self.prompt_tps > 0 or self.generation_tps > 0


@dataclass(frozen=True)
class JitCompile:
    what: str  # "Triton kernel _causal_conv1d_update_kernel", "flashinfer.jit: ..."


@dataclass(frozen=True)
class ShmWait:
    """The executor has waited ``interval_s`` more for a worker's answer to one engine step."""

    interval_s: int  # VLLM_RINGBUFFER_WARNING_INTERVAL, as the line states it


_THROUGHPUT = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, "
    r"Avg generation throughput: (?P<gen>[\d.]+) tokens/s, Running: (?P<running>\d{1,18}) reqs, "
    r"(?:Swapped: \d+ reqs, )?(?:Pending|Waiting): (?P<waiting>\d{1,18}) reqs"
    # 0.32: `Deferred: N reqs` and `KV fetch: ...` when non-zero; the device word is the platform's (GPU, CPU, XPU)
    r"(?:, Deferred: \d+ reqs)?(?:, KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting)?"
    r"(?:, Preemptions: \d+)?"
    r"(?:, (?:[A-Z]{2,4} )?KV cache usage: (?P<kv>[\d.]+)%)?"
)
_JIT_MONITOR = re.compile(r"(?P<kind>[\w/ -]+?) JIT compilation during inference: (?P<name>[^\s.(]+)")
_FLASHINFER_JIT = re.compile(r"flashinfer\.jit: (?P<msg>.*)")
_OTHER_JIT = re.compile(
    r"(?P<msg>Triton autotuning for function \w+|JIT-compil\w* .*|Compiling a graph for (?:dynamic shape|compile "
    r"range|general shape)[^,]*|Dynamo bytecode transform time)"
)


_SHM_WAIT = re.compile(r"No available shared memory broadcast block found in (?P<seconds>\d{1,18}) seconds")


def read_serve_line(raw: str) -> Throughput | JitCompile | ShmWait | None:
    """What one raw log line says about serving progress, if anything."""
    text = clean(raw)
    if "throughput" in text:
        m = _THROUGHPUT.search(text)
        if m is not None:
            kv = m.group("kv")
            return Throughput(engine=m.group("engine") or "000", prompt_tps=float(m.group("prompt")),
                              generation_tps=float(m.group("gen")), running=int(m.group("running")),
                              waiting=int(m.group("waiting")), kv_cache_usage_pct=float(kv) if kv else None)
    if "JIT" in text or "jit" in text or "Compiling" in text or "Dynamo" in text or "autotuning" in text:
        m = _JIT_MONITOR.search(text)
        if m is not None:
            return JitCompile(f"{m.group('kind').strip()} {m.group('name')}")
        m = _FLASHINFER_JIT.search(text) or _OTHER_JIT.search(text)
        if m is not None:
            return JitCompile(m.group(0).strip()[:120])
    if "shared memory broadcast" in text:
        m = _SHM_WAIT.search(text)
        if m is not None and int(m.group("seconds")) > 0:
            return ShmWait(int(m.group("seconds")))
    return None
