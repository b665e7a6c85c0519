"""The status snapshot: one dict that status.json, the control API and sparkctl all show. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkd import __version__
from sparkd.config import Config
from sparkd.runtime.base import Instance
from sparkd.supervisor.machine import SERVING, Machine
from sparkd.supervisor.progress import Progress


@dataclass(frozen=True)
class Clock:
    """Maps monotonic times to wall-clock seconds for display (decisions never use the wall clock)."""

    wall_at_mono_zero: float

    def wall(self, mono: float | None) -> float | None:
        return None if mono is None else self.wall_at_mono_zero + mono


def snapshot(
    cfg: Config, m: Machine, *, instance: Instance | None, progress: Progress, clock: Clock, now: float,
    failure_at: float | None, daemon_pid: int, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    last = m.last_failure
    return {
        "version": __version__,
        "node": cfg.node.name,
        "role": cfg.node.role.value,
        "runtime": cfg.runtime.value,
        "state": m.state.value,
        "since": clock.wall(m.since),
        "ready": m.state in SERVING,
        "pid": instance.pid if instance else None,
        "container_id": instance.container_id if instance else None,
        "restarts": m.restarts,
        "launches": m.launches,
        "uptime_s": round(now - m.restart_state.ready_since, 1) if m.restart_state.ready_since else None,
        "phase": progress.phase.value if instance else None,
        "shards": [progress.shards_loaded, progress.shards_total] if progress.shards_total else None,
        "kv_cache_tokens": progress.kv_cache_tokens,
        "max_concurrency": progress.max_concurrency,
        "health": m.health_note,
        "breaker": {"open": m.breaker_open, "reason": m.restart_state.breaker_reason},
        "backoff_until": clock.wall(m.deadline) if m.deadline is not None else None,
        "last_failure": None if last is None else {
            "class": last.cls.value, "message": last.sentence, "at": failure_at,
            "exit_code": last.exit_code, "signal": last.signal, "evidence": last.evidence,
        },
        "config_hash": cfg.launch_hash(),
        "daemon_pid": daemon_pid,
        "updated_at": clock.wall(now),
        **(extra or {}),
    }
