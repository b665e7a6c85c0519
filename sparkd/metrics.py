"""Prometheus metrics, collected at scrape time from the daemon's state (the node_exporter way).

Nothing is kept twice: a scrape reads the machine, the progress, the health tracker and the counters the
daemon already has, so the numbers can never drift from the status file. Conventions: ``sparkd_`` prefix,
base units, ``_total`` counters, ``_seconds``, ``_bytes``, ``_info``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from sparkd import __version__
from sparkd.supervisor.machine import SERVING, State
from sparkd.supervisor.progress import Phase

if TYPE_CHECKING:
    from sparkd.daemon import Daemon

# Cold starts of the real model take 8-10 minutes; the stand-in takes seconds.
START_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600)


class DaemonCounters:
    """Counters the daemon bumps as things happen (everything else is read at scrape time)."""

    def __init__(self) -> None:
        self.restarts: Counter[str] = Counter()  # by the failure class that caused them
        self.failures: Counter[str] = Counter()
        self.last_exit_code: int | None = None


class SparkdCollector(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Any]:
        d = self.daemon
        m = d.machine
        info = InfoMetricFamily("sparkd_build", "sparkd build information.")
        info.add_metric([], {"version": __version__, "node": d.cfg.node.name, "role": d.cfg.node.role.value,
                             "runtime": d.cfg.runtime.value})
        yield info
        state = GaugeMetricFamily("sparkd_state", "1 for the current lifecycle state.", labels=["state"])
        for s in State:
            state.add_metric([s.value], 1.0 if m.state is s else 0.0)
        yield state
        yield GaugeMetricFamily("sparkd_ready", "1 when vLLM serves (ready or degraded).",
                                value=1.0 if m.state in SERVING else 0.0)
        yield GaugeMetricFamily("sparkd_breaker_open", "1 when the restart breaker is open.",
                                value=1.0 if m.breaker_open else 0.0)
        backoff = max(0.0, m.deadline - d.now()) if m.state is State.backoff and m.deadline else 0.0
        yield GaugeMetricFamily("sparkd_backoff_seconds", "Seconds until the next start attempt.", value=backoff)
        yield from self._counters()
        yield from self._progress()
        yield from self._health()
        yield from self._preflight()
        yield from d.extra_metrics()

    def _counters(self) -> Iterator[Any]:
        c = self.daemon.counters
        restarts = CounterMetricFamily("sparkd_restarts", "Restarts of vLLM by the failure that caused them.",
                                       labels=["reason"])
        for reason, n in sorted(c.restarts.items()):
            restarts.add_metric([reason], n)
        yield restarts
        failures = CounterMetricFamily("sparkd_failures", "Failures of vLLM by class.", labels=["class"])
        for cls, n in sorted(c.failures.items()):
            failures.add_metric([cls], n)
        yield failures
        if c.last_exit_code is not None:
            yield GaugeMetricFamily("sparkd_last_exit_code", "Exit status of the last vLLM process that ended.",
                                    value=c.last_exit_code)

    def _progress(self) -> Iterator[Any]:
        d = self.daemon
        phase = GaugeMetricFamily("sparkd_startup_phase", "1 for vLLM's current startup phase.", labels=["phase"])
        current = d.progress.phase if d.instance is not None else None
        for p in Phase:
            phase.add_metric([p.value], 1.0 if p is current else 0.0)
        yield phase
        if d.progress.kv_cache_tokens is not None:
            yield GaugeMetricFamily("sparkd_vllm_kv_cache_tokens", "GPU KV cache size vLLM reported, in tokens.",
                                    value=d.progress.kv_cache_tokens)
        if d.progress.max_concurrency is not None:
            yield GaugeMetricFamily("sparkd_vllm_max_concurrency",
                                    "Maximum concurrency at max_model_len vLLM reported.",
                                    value=d.progress.max_concurrency)

    def _health(self) -> Iterator[Any]:
        tracker = self.daemon.health
        probes = CounterMetricFamily("sparkd_probes", "Health probes by probe and result.", labels=["probe", "result"])
        for (probe, outcome), n in sorted(tracker.probes_total.items()):
            probes.add_metric([probe, str(outcome)], n)
        yield probes
        latency = GaugeMetricFamily("sparkd_probe_latency_seconds", "Latency of the last probe.", labels=["probe"])
        for probe, seconds in sorted(tracker.last_latency_s.items()):
            latency.add_metric([probe], seconds)
        yield latency

    def _preflight(self) -> Iterator[Any]:
        results = GaugeMetricFamily("sparkd_preflight_check", "Verdict of each check in the last preflight.",
                                    labels=["check", "verdict"])
        durations = GaugeMetricFamily("sparkd_preflight_check_duration_seconds",
                                      "Duration of each check in the last preflight.", labels=["check"])
        for r in self.daemon.last_preflight:
            results.add_metric([str(r["id"]), str(r["verdict"])], 1.0)
            durations.add_metric([str(r["id"])], float(r["duration_s"]))  # type: ignore[arg-type]
        yield results
        yield durations


class Metrics:
    """The registry a scrape renders, plus the start-duration histogram the daemon observes."""

    def __init__(self, daemon: Daemon) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SparkdCollector(daemon))
        self.start_duration = Histogram("sparkd_start_duration_seconds", "From launch to ready.",
                                        buckets=START_BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
