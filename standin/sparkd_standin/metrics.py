"""vLLM's Prometheus metrics (V1 names, ``engine``/``model_name`` labels) and its periodic stats log line.

- The gauges (running, waiting, KV usage) change only when an engine step completes: vLLM publishes the
  scheduler's stats with each step's output (``scheduler.update_from_output`` → the output handler → the stat
  loggers). A request reaching a wedged engine is counted by the scheduler but never published; the gauges keep
  the last completed step's values (0 after an idle spell) — ``step_completed`` is the one place they move.
- ``--disable-log-stats``: vLLM builds no stat loggers, so /metrics has no ``vllm:*`` family at all (the
  process collectors stay); the stats line is not logged either.
- The stats line (``Engine 000: Avg prompt throughput ...``) every VLLM_LOG_STATS_INTERVAL (10 s) reads the
  same published stats; it is DEBUG while the engine is idle (this and the previous interval had no
  throughput), so a wedge shows one last line with 0.0 tokens/s and then nothing at INFO.
- With ``--speculative-config`` (its ``num_speculative_tokens`` k): vLLM 0.32's spec-decode counters
  (``vllm/v1/spec_decode/metrics.py``): one draft of k tokens per k+1 generated, every position accepting while
  ``spec_accepting`` (knob ``SPEC_DECODE_ACCEPTS``), none after. With ``VLLM_COMPUTE_NANS_IN_LOGITS=1``:
  ``vllm:corrupted_requests``, which counts every finished request while ``nan_logits`` (knob ``NAN_LOGITS``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from sparkd_standin import logfmt
from sparkd_standin.args import ServeConfig

FINISHED_REASONS = ("stop", "length", "abort", "error")
ITERATION_BUCKETS: list[float] = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def cache_config_labels(config: ServeConfig, kv_tokens: int) -> dict[str, str]:
    return {
        "block_size": str(config.block_size),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "swap_space": str(config.swap_space),
        "cache_dtype": config.kv_cache_dtype,
        "is_attention_free": "False",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "prefix_caching_hash_algo": "sha256",
        "cpu_offload_gb": "0",
        "calculate_kv_scales": "False",
        "cpu_kvcache_space_bytes": "None",
        "mamba_page_size_padded": "None",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "num_gpu_blocks": str(kv_tokens // max(1, config.block_size)),
        "num_cpu_blocks": "None",
        "kv_sharing_fast_prefill": "False",
        "kv_cache_memory_bytes": str(config.kv_cache_memory_bytes),
        "kv_offloading_size": "None",
        "kv_offloading_backend": "None",
        "engine": "0",
    }


# (attribute, name, help). Counters are exposed as <name>_total (+ <name>_created).
GAUGES = (
    ("g_running", "vllm:num_requests_running", "Number of requests in model execution batches."),
    ("g_waiting", "vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("g_kv_usage", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
COUNTERS = (
    ("c_prefix_queries", "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("c_prefix_hits", "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("c_preemptions", "vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    ("c_prompt", "vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("c_generation", "vllm:generation_tokens", "Number of generation tokens processed."),
)
# (attribute, name, help, buckets); None = 1-2-5 buckets up to max_model_len.
HISTOGRAMS: tuple[tuple[str, str, str, list[float] | None], ...] = (
    ("h_prompt", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", None),
    ("h_generation", "vllm:request_generation_tokens", "Number of generation tokens processed.", None),
    ("h_iteration", "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     ITERATION_BUCKETS),
    ("h_max_tokens", "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", None),
    ("h_n", "vllm:request_params_n", "Histogram of the n request parameter.", [1.0, 2.0, 5.0, 10.0, 20.0]),
    ("h_ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("h_itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("h_e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS),
    ("h_queue", "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     LATENCY_BUCKETS),
    ("h_inference", "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     LATENCY_BUCKETS),
)  # fmt: skip
SPEC_COUNTERS = (
    ("drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("accepted", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
)


def spec_positions(speculative_config: Any) -> int:
    """The draft length of ``--speculative-config`` (``num_speculative_tokens``); 0 without one."""
    if not isinstance(speculative_config, dict):
        return 0
    try:
        return max(0, int(speculative_config.get("num_speculative_tokens") or 0))
    except (TypeError, ValueError):
        return 0


SLEEP_STATE_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)


class VllmMetrics:
    """The metric families, the scheduler's live counts, and what the last completed step published."""

    g_running: Gauge
    g_waiting: Gauge
    g_kv_usage: Gauge
    c_prefix_queries: Counter
    c_prompt: Counter
    c_generation: Counter
    h_prompt: Histogram
    h_generation: Histogram
    h_iteration: Histogram
    h_max_tokens: Histogram
    h_n: Histogram
    h_ttft: Histogram
    h_itl: Histogram
    h_e2e: Histogram
    h_queue: Histogram
    h_inference: Histogram

    def __init__(self, config: ServeConfig, kv_tokens: int, *, exposed: bool = True) -> None:
        self.registry = CollectorRegistry()  # what /metrics shows
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        families = self.registry if exposed else CollectorRegistry()  # --disable-log-stats: shown nowhere
        self.kv_tokens = max(1, kv_tokens)
        self.running = self.waiting = self.tokens_in_use = self.prompt_total = self.generation_total = 0
        self.published = (0, 0, 0.0)  # (running, waiting, KV usage) as of the last completed step
        self.spec_accepting = True
        self.nan_logits = False
        self.spec_positions = spec_positions(config.speculative_config)
        self._since_draft = 0
        labels = {"model_name": config.served_model_names[0], "engine": "0"}
        self._register(config, labels, families)
        self._register_checks(labels, families)
        info = cache_config_labels(config, kv_tokens)
        cache_info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info), registry=families
        )
        cache_info.labels(**info).set(1)  # every CacheConfig field is a label; no model_name
        self.step_completed()

    def _register(self, config: ServeConfig, labels: dict[str, str], reg: CollectorRegistry) -> None:
        """Every family with its labelled series created up front, as vLLM does (so they show at 0)."""
        names = list(labels)
        for attr, name, doc in GAUGES:
            setattr(self, attr, Gauge(name, doc, names, registry=reg).labels(**labels))
        for attr, name, doc in COUNTERS:
            setattr(self, attr, Counter(name, doc, names, registry=reg).labels(**labels))
        len_buckets = build_1_2_5_buckets(config.resolved_max_model_len)
        for attr, name, doc, buckets in HISTOGRAMS:
            family = Histogram(name, doc, names, buckets=buckets or len_buckets, registry=reg)
            setattr(self, attr, family.labels(**labels))
        sleep_state = Gauge("vllm:engine_sleep_state", SLEEP_STATE_HELP, [*names, "sleep_state"], registry=reg)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep_state.labels(**labels, sleep_state=state).set(value)
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"],
            registry=reg,
        )  # fmt: skip
        self.c_success = {reason: success.labels(**labels, finished_reason=reason) for reason in FINISHED_REASONS}

    def _register_checks(self, labels: dict[str, str], reg: CollectorRegistry) -> None:
        """The families the acceptance gate reads, where the launch asks for them (as vLLM 0.32 creates them)."""
        names = list(labels)
        self.c_spec: dict[str, Any] = {}
        self.c_spec_pos: list[Any] = []
        if self.spec_positions:
            for key, name, doc in SPEC_COUNTERS:
                self.c_spec[key] = Counter(name, doc, names, registry=reg).labels(**labels)
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              [*names, "position"], registry=reg)
            self.c_spec_pos = [per_pos.labels(**labels, position=str(p)) for p in range(self.spec_positions)]
        self.c_corrupted = None
        if os.environ.get("VLLM_COMPUTE_NANS_IN_LOGITS", "0") not in ("", "0"):
            self.c_corrupted = Counter("vllm:corrupted_requests", "Corrupted requests, in terms of total number of "
                                       "requests with NaNs in logits.", names, registry=reg).labels(**labels)

    def _draft(self) -> None:
        """One token more: every k+1 tokens a draft of k was proposed (and accepted, unless it stopped accepting)."""
        if not self.spec_positions:
            return
        self._since_draft += 1
        if self._since_draft <= self.spec_positions:
            return
        self._since_draft = 0
        self.c_spec["drafts"].inc()
        self.c_spec["draft_tokens"].inc(self.spec_positions)
        if self.spec_accepting:
            self.c_spec["accepted"].inc(self.spec_positions)
            for counter in self.c_spec_pos:
                counter.inc()

    def step_completed(self) -> None:
        """An engine step finished: its scheduler stats become what the gauges and the stats line show."""
        self.published = (self.running, self.waiting, min(1.0, self.tokens_in_use / self.kv_tokens))
        running, waiting, usage = self.published
        self.g_running.set(running)
        self.g_waiting.set(waiting)
        self.g_kv_usage.set(usage)

    def request_started(self, prompt_tokens: int, max_tokens: int) -> None:
        """The request's prefill step completed."""
        self.running += 1
        self.tokens_in_use += prompt_tokens
        self.prompt_total += prompt_tokens
        self.c_prompt.inc(prompt_tokens)
        self.c_prefix_queries.inc(prompt_tokens)
        self.h_iteration.observe(prompt_tokens)
        self.h_prompt.observe(prompt_tokens)
        self.h_max_tokens.observe(max_tokens)
        self.h_n.observe(1)
        self.h_queue.observe(0.0)
        self.step_completed()

    def request_held(self, *, scheduled: bool) -> None:
        """A request reaching a wedged engine: the scheduler runs the first and queues the rest, but no step
        completes, so nothing is published."""
        if scheduled:
            self.running += 1
        else:
            self.waiting += 1

    def request_released(self, *, scheduled: bool) -> None:
        if scheduled:
            self.running -= 1
        else:
            self.waiting -= 1

    def token_generated(self, gap_s: float | None) -> None:
        self.tokens_in_use += 1
        self.generation_total += 1
        self.c_generation.inc()
        self._draft()
        self.h_iteration.observe(1)
        if gap_s is not None:
            self.h_itl.observe(gap_s)
        self.step_completed()

    def first_token(self, ttft_s: float) -> None:
        self.h_ttft.observe(ttft_s)

    def request_finished(self, reason: str, prompt_tokens: int, generated: int, e2e_s: float) -> None:
        """Finished or aborted (published with the step that processes it); an engine that died publishes
        nothing more."""
        self.running -= 1
        self.tokens_in_use -= prompt_tokens + generated
        self.c_success[reason].inc()
        if self.c_corrupted is not None and self.nan_logits:
            self.c_corrupted.inc()
        if reason in ("stop", "length"):
            self.h_generation.observe(generated)
            self.h_e2e.observe(e2e_s)
            self.h_inference.observe(e2e_s)
        if reason != "error":
            self.step_completed()


class StatsLogger:
    """``Engine 000: Avg prompt throughput ...`` every interval; DEBUG (not shown) while the engine is idle."""

    def __init__(self, metrics: VllmMetrics, where: str, device: str = "GPU") -> None:
        self.metrics = metrics
        self.where = where
        self.device = device  # the platform's word: GPU, or CPU on vLLM's CPU build (0.32)
        self._last_time = time.monotonic()
        self._last_prompt = metrics.prompt_total
        self._last_generation = metrics.generation_total
        self._last_throughputs = (0.0, 0.0)

    def log(self) -> None:
        now, m = time.monotonic(), self.metrics
        elapsed = max(now - self._last_time, 1e-6)
        prompt_tp = (m.prompt_total - self._last_prompt) / elapsed
        generation_tp = (m.generation_total - self._last_generation) / elapsed
        idle = not any((prompt_tp, generation_tp, *self._last_throughputs))
        self._last_time, self._last_prompt, self._last_generation = now, m.prompt_total, m.generation_total
        self._last_throughputs = (prompt_tp, generation_tp)
        running, waiting, usage = m.published
        logfmt.log(
            "DEBUG" if idle else "INFO",
            self.where,
            f"Engine 000: Avg prompt throughput: {prompt_tp:.1f} tokens/s, Avg generation throughput: "
            f"{generation_tp:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
            f"{self.device} KV cache usage: {100 * usage:.1f}%, Prefix cache hit rate: 0.0%",
        )
