"""The daemon's side of the memory guard: its hooks, its start gate and its metrics.

The guard samples and decides; these hooks turn its decisions into the supervisor's observations (a guard
stop is a classified failure, ``killed_by_guard``), write the evidence before any signal, and export what it
sees to Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sparkd.guard.guard import Guard
from sparkd.guard.policy import Decision
from sparkd.incidents import incident_record, write_incident
from sparkd.supervisor import machine as sm
from sparkd.supervisor.failures import Failure, FailureClass

if TYPE_CHECKING:
    from sparkd.daemon import Daemon


class DaemonGuardHooks:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def vllm_pids(self) -> set[int]:
        d = self.daemon
        return d.runtime.pids(d.instance) if d.instance is not None else set()

    def starting(self) -> bool:
        return self.daemon.machine.state in (sm.State.preflight, sm.State.starting)

    def idle(self) -> bool | None:
        metrics = self.daemon.last_vllm_metrics
        return None if metrics is None else metrics.num_requests_running <= 0

    def on_decision(self, decision: Decision) -> None:
        self.daemon.log.info("guard_decision", action=decision.action.value, level=decision.level.value,
                             start_allowed=decision.start_allowed, reason=decision.reason,
                             available=decision.available, dry_run=decision.dry_run)

    def write_evidence(self, failure: Failure) -> None:
        """Quick and synchronous: the incident folder exists before the guard signals anything."""
        d = self.daemon
        if d.watch is not None:
            d.watch.hint = FailureClass.killed_by_guard
        d.recorded.add(id(failure))
        at = d.note_failure(failure)
        guard = d.guard
        record = incident_record(failure, at=at, config_hash=d.cfg.launch_hash(),
                                 node=d.cfg.node.name, state=d.machine.state.value,
                                 pid=d.instance.pid if d.instance else None,
                                 guard=guard.evidence() if guard is not None else None)
        write_incident(d.cfg.paths.incidents, record, log_tail=d.vllm_log.last(300),
                       keep=d.cfg.supervisor.incidents_keep, kernel_log=False)

    async def stop_vllm(self, failure: Failure, grace_s: float) -> None:
        self.daemon.next_stop_grace_s = grace_s
        self.daemon.post(sm.HealthFailed(failure))

    async def kill_vllm(self, failure: Failure) -> None:
        self.daemon.next_stop_grace_s = 0.0
        self.daemon.post(sm.HealthFailed(failure))

    async def planned_restart(self, reason: str) -> None:
        self.daemon.log.warning("guard_planned_restart", reason=reason)
        self.daemon.post(sm.RestartRequested())


def start_refusal(guard: Guard | None) -> Failure | None:
    """The guard's start gate as a preflight failure: a start waits for headroom with backoff."""
    if guard is None or guard.start_allowed or guard.decision is None:
        return None
    return Failure(cls=FailureClass.free_memory_refusal, exit_code=None, signal=None, evidence=None,
                   sentence=f"The memory guard refuses a start: {guard.decision.reason}; sparkd waits for "
                   "headroom and tries again with backoff.")


def guard_metrics(guard: Guard) -> Iterator[Any]:
    sample = guard.latest
    if sample is not None:
        m = sample.mem
        for name, value, help_text in (
            ("sparkd_memory_total_bytes", m.mem_total, "MemTotal."),
            ("sparkd_memory_available_bytes", m.mem_available, "MemAvailable."),
            ("sparkd_memory_free_bytes", m.mem_free, "MemFree."),
            ("sparkd_memory_page_cache_bytes", m.cached, "Page cache (Cached)."),
            ("sparkd_memory_shmem_bytes", m.shmem, "Shared memory (Shmem)."),
            ("sparkd_memory_driver_residual_bytes", m.driver_residual,
             "MemTotal - MemFree - Active - Inactive - Slab - PageTables - Unevictable (GPU driver on GB10)."),
            ("sparkd_memory_swap_used_bytes", m.swap_total - m.swap_free, "Swap in use."),
        ):
            yield GaugeMetricFamily(name, help_text, value=value)
        if sample.psi is not None:
            psi = GaugeMetricFamily("sparkd_memory_pressure_avg10_ratio", "PSI memory avg10 as a ratio.",
                                    labels=["kind"])
            psi.add_metric(["some"], sample.psi.some_avg10 / 100)
            psi.add_metric(["full"], sample.psi.full_avg10 / 100)
            yield psi
        yield CounterMetricFamily("sparkd_kernel_nvrm_no_memory", "NV_ERR_NO_MEMORY lines in the kernel log.",
                                  value=sample.nvrm_errors)
    actions = CounterMetricFamily("sparkd_guard_actions", "Memory guard actions by kind.", labels=["action"])
    for action, n in sorted(guard.counters.actions.items()):
        actions.add_metric([action], n)
    yield actions
    yield GaugeMetricFamily("sparkd_guard_start_allowed", "1 when the guard allows vLLM to start.",
                            value=1.0 if guard.start_allowed else 0.0)
    trend = guard.trend
    if trend is not None:
        yield GaugeMetricFamily("sparkd_guard_leak_slope_bytes_per_second",
                                "Theil-Sen slope of MemAvailable over the trend window.", value=trend.slope)
        if trend.seconds_to_floor is not None:
            yield GaugeMetricFamily("sparkd_guard_seconds_to_floor",
                                    "Predicted seconds until MemAvailable reaches the stop floor.",
                                    value=trend.seconds_to_floor)
