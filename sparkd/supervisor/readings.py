"""What the probes read of a running vLLM: one probe's outcome, the series of its /metrics. Pure data.

The I/O (``sparkd.daemon.watch.probes``) makes these; the health layers (``health``, ``stall``) fold them into verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = ["MetricsOff", "ProbeName", "ProbeOutcome", "ProbeResult", "VllmMetrics"]

ProbeName = Literal["health", "canary", "metrics"]


class ProbeOutcome(StrEnum):
    ok = "ok"  # /health 200, or a generation that answered
    engine_dead = "engine_dead"  # /health 503, or a generation answered "EngineCore encountered an issue"
    refused = "refused"  # connection refused: nothing listens on the port
    timeout = "timeout"  # no answer within the probe's timeout
    error = "error"  # could not probe: another status, a reset, a malformed answer


@dataclass(frozen=True)
class ProbeResult:
    outcome: ProbeOutcome
    latency_s: float  # from sending the request to the outcome
    detail: str = ""  # short: "HTTP 404", "no answer in 5 s", "connection refused"


@dataclass(frozen=True)
class VllmMetrics:
    """The series of vLLM's /metrics the health checks read; summed over label sets (engines)."""

    num_requests_running: float
    generation_tokens_total: float
    num_requests_waiting: float | None = None
    prompt_tokens_total: float | None = None
    kv_cache_usage_perc: float | None = None  # 0..1; the highest over engines
    engine_steps_total: float | None = None  # vllm:iteration_tokens_total's count: engine steps with outputs


@dataclass(frozen=True)
class MetricsOff:
    """`/metrics` answered 200 without any `vllm:*` family: vLLM runs with `--disable-log-stats`."""
