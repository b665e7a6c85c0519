"""What the daemon shows: status.json and the control API's status, the systemd STATUS line, the recent
history of states and phases, and the metrics the daemon counts as things happen."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily

from sparkd.cluster.shared import shared_settings
from sparkd.guard.wiring import guard_metrics
from sparkd.memory import memory_metrics, read_meminfo
from sparkd.statefile import write_json
from sparkd.status import Clock, snapshot
from sparkd.supervisor import machine as sm
from sparkd.supervisor.machine import State

if TYPE_CHECKING:
    from sparkd.daemon import Daemon


class Reporter:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.clock = Clock(time.time() - time.monotonic())
        # Recent states and phases with wall times, so `sparkctl restart --wait` shows every step.
        self.history: deque[dict[str, Any]] = deque(maxlen=50)

    def remember(self, **entry: Any) -> None:
        progress = self.d.progress
        if entry.get("phase") == "loading_weights" and progress.shards_total:
            entry["shards"] = [progress.shards_loaded, progress.shards_total]
        self.history.append({"at": time.time(), **entry})

    def count_transition(self, before: sm.Machine, after: sm.Machine, now: float) -> None:
        d = self.d
        if after.state is State.ready and before.state is State.starting and after.started_at is not None \
                and after.launches:
            d.metrics.start_duration.observe(now - after.started_at)
        if after.launches > before.launches > 0:
            d.counters.restarts[after.restart_reason or "unknown"] += 1

    def status_line(self) -> str:
        d = self.d
        m, p = d.machine, d.progress
        line = m.state.value
        if m.state is State.starting and d.instance is not None:
            line += f": {p.phase.value}" + (f" {p.shards_loaded}/{p.shards_total}" if p.shards_total else "")
        if d.instance is not None:
            line += f", pid {d.instance.pid}"
        line += f", restarts {m.restarts}"
        if m.last_failure is not None and m.state in (State.backoff, State.failed):
            line += f", last failure {m.last_failure.cls.value}"
        return line

    def status(self) -> dict[str, Any]:
        d = self.d
        return snapshot(
            d.cfg, d.machine, instance=d.instance, progress=d.progress, clock=self.clock, now=time.monotonic(),
            failure_at=d.failure_at, daemon_pid=os.getpid(),
            extra={"history": list(self.history), **self._pair(), "memory": self._memory()},
        )

    def _memory(self) -> dict[str, Any]:
        meminfo, guard = read_meminfo(), self.d.guard
        return {
            "available_bytes": meminfo.get("MemAvailable"), "free_bytes": meminfo.get("MemFree"),
            "total_bytes": meminfo.get("MemTotal"),
            "guard": None if guard is None or guard.decision is None else {
                "action": guard.decision.action.value, "level": guard.decision.level.value,
                "start_allowed": guard.start_allowed, "reason": guard.decision.reason},
        }

    def _pair(self) -> dict[str, Any]:
        d = self.d
        return {"pair": d.pair, "shared": shared_settings(d.cfg), "image_id": d.image_id,
                "peers": d.coordinator.peers_json() if d.coordinator else []}

    def write(self) -> None:
        try:
            write_json(self.d.status_path, self.status())
        except OSError as exc:
            self.d.log.error("status_write_failed", error=str(exc))

    def extra_metrics(self) -> Iterator[Any]:
        """Memory (the guard's samples when it runs, else a plain reading) and the peers."""
        d = self.d
        if d.guard is not None:
            yield from guard_metrics(d.guard)
        else:
            yield from memory_metrics(read_meminfo())
        if d.coordinator is not None:
            up = GaugeMetricFamily("sparkd_peer_up", "1 when the peer's sparkd answers.", labels=["peer"])
            for peer in d.coordinator.peers_json():
                up.add_metric([peer["peer"]], 1.0 if peer["reachable"] else 0.0)
            yield up
