"""What the daemon shows: the status (status.json, the control API, sparkctl), the systemd STATUS line and the
recent history of states and phases. Read-only: it reads the supervisor, the node, the guard and the group,
and writes nothing but its own history.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Protocol

from sparkd import __version__
from sparkd.cluster.shared import shared_settings
from sparkd.commands.statusdoc import Checks, Extras, Status
from sparkd.config import Config
from sparkd.daemon.effects.node import Node
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.daemon.watch.gpus import GpuSampler
from sparkd.guard.guard import Guard
from sparkd.guard.meminfo import MemInfo, read_meminfo
from sparkd.host.clock import Clock, wall_of
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.progress import Phase, Startup
from sparkd.supervisor.states import SERVING, Machine, State

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

HISTORY = 50


class DaemonFacts(Protocol):
    """What the daemon itself tells the status (the :class:`sparkd.daemon.app.Daemon`)."""

    def problems(self) -> list[str]:
        """What sparkd itself cannot do right now (it reports itself degraded until they clear)."""

    def config_state(self) -> dict[str, Any]:
        """The config on disk against the one loaded and the one the running vLLM was launched from."""

    def more(self) -> Extras:
        """What other parts add (the flight recorder, the memory settle)."""

    def proofs(self) -> Checks:
        """The group's fabric and weights proofs: ``{"fabric": ..., "weights": ...}``."""


class StatusView:
    def __init__(self, config: CurrentConfig, sup: Supervisor, node: Node, clock: Clock, *, daemon: DaemonFacts,
                 guard: Guard | None = None, group: Coordinator | None = None, gpu: GpuSampler | None = None) -> None:
        self.config = config  # its token: secrets in "shared" are digests under the peers' shared secret
        self.sup = sup
        self.node = node
        self.clock = clock
        self.daemon = daemon
        self._guard = guard
        self.group = group
        self.gpu = gpu
        # Recent states and phases with wall times, so `sparkctl restart --wait` shows every step.
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.restarts: Counter[str] = Counter()  # by what caused them: a failure class, operator, reset
        self.last_start_s: float | None = None  # launch to ready, the last time (the ETA of the next)
        sup.listen(self.on_change)
        node.output.listen(self.on_phase)

    @property
    def cfg(self) -> Config:
        return self.config()

    def guard(self) -> Guard | None:
        return self._guard

    def on_change(self, before: Machine, after: Machine, obs: v.Observation) -> None:
        if after.state is not before.state:
            self.history.append({"at": self.clock.wall(), "state": after.state.value})
        if after.launches > before.launches > 0:
            self.restarts[after.restart_reason or "unknown"] += 1
        if after.state is State.ready and before.state is State.starting and after.started_at is not None:
            self.last_start_s = round(after.since - after.started_at, 1)

    def note_phase(self, phase: str) -> None:
        """A phase another part runs (the memory settle) into the history."""
        self.history.append({"at": self.clock.wall(), "state": self.sup.machine.state.value, "phase": phase})

    def on_phase(self, startup: Startup) -> None:
        entry: dict[str, Any] = {"at": self.clock.wall(), "state": self.sup.machine.state.value,
                                 "phase": startup.phase.value}
        if startup.phase is Phase.loading_weights and startup.shards_total:
            entry["shards"] = [startup.shards_loaded, startup.shards_total]
        self.history.append(entry)

    def line(self) -> str:
        """The systemd STATUS= line: ``ready, pid 1234, restarts 0``."""
        m, p, instance = self.sup.machine, self.node.startup, self.node.instance
        text = m.state.value
        if m.state is State.starting and instance is not None:
            text += f": {p.phase.value}" + (f" {p.shards_loaded}/{p.shards_total}" if p.shards_total else "")
        if instance is not None:
            text += f", pid {instance.pid}"
        text += f", restarts {m.restarts}"
        if m.last_failure is not None and m.state in (State.backoff, State.failed):
            text += f", last failure {m.last_failure.cls.value}"
        return text

    def status(self) -> Status:
        m, node, clock, now = self.sup.machine, self.node, self.clock, self.clock.now()
        instance, startup, last = node.instance, node.startup, m.last_failure
        ready_since = m.restart_state.ready_since
        problems = self.daemon.problems()
        return {
            "version": __version__, "node": self.cfg.node.name, "role": self.cfg.node.role.value,
            "rank": self.cfg.node_rank, "gpus_per_node": self.cfg.cluster.gpus_per_node,
            "runtime": self.cfg.runtime.value,
            "state": m.state.value, "since": wall_of(clock, m.since), "ready": m.state in SERVING,
            "intent": m.intent.value,
            "pid": instance.pid if instance else None, "container_id": instance.container_id if instance else None,
            "restarts": m.restarts, "launches": m.launches,
            "uptime_s": round(now - ready_since, 1) if ready_since is not None else None,
            "phase": startup.phase.value if instance else None,
            "shards": [startup.shards_loaded, startup.shards_total] if startup.shards_total else None,
            "kv_cache_tokens": startup.kv_cache_tokens, "max_concurrency": startup.max_concurrency,
            "last_start_s": self.last_start_s,
            "start_timing": node.timing.to_json() if node.timing is not None else None,
            "health": m.health_note,
            "watch_note": node.watch.health.watch_note if node.watch is not None else None,
            "breaker": {"open": m.breaker_open, "reason": m.breaker_reason},
            "backoff_until": wall_of(clock, m.deadline) if m.state is State.backoff else None,
            "last_failure": None if last is None else {
                "class": last.cls.value, "message": last.sentence, "at": node.evidence.counters.failure_at,
                "exit_code": last.exit_code, "signal": last.signal, "evidence": last.evidence},
            "config_hash": self.cfg.launch_hash(), "daemon_pid": os.getpid(), "updated_at": clock.wall(),
            "daemon": {"degraded": bool(problems), "problems": problems},
            "config": self.daemon.config_state(),
            "history": list(self.history),
            "pair": self.group.role.value if self.group is not None and self.group.role else None,
            "shared": shared_settings(self.cfg, self.config.token), "image": node.facts.image_json(),
            "image_id": node.facts.image.id if node.facts.image else None, "drift": node.facts.drift,
            "peers": self.group.peers_json() if self.group is not None else [],
            "memory": self._memory(),
            "gpu": self.gpu.status() if self.gpu is not None else None,
            "last_stop": node.last_stop.to_json() if node.last_stop is not None else None,
            **self.daemon.more(),
            **self.daemon.proofs(),
        }

    def _memory(self) -> dict[str, Any]:
        guard = self.guard()
        sample = guard.latest if guard is not None else None
        mem: MemInfo | None = sample.mem if sample is not None else read_meminfo()
        decision = guard.decision if guard is not None else None
        return {
            "available_bytes": mem.mem_available if mem else None, "free_bytes": mem.mem_free if mem else None,
            "total_bytes": mem.mem_total if mem else None,
            "guard": None if guard is None or decision is None else {
                "action": decision.action.value, "level": decision.level.name,
                "start_allowed": guard.start_allowed, "reason": decision.reason},
        }
