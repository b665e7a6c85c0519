"""What the daemon shows: the status (status.json, the control API, sparkctl), the systemd STATUS line and the
recent history of states and phases — functions of the node's last state (:class:`NodeState`) and of what the
senses last read (:class:`Seen`). Read-only: the history is the one thing it keeps, fed by the loop's ``on_state``.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkd import __version__
from sparkd.cluster.shared import shared_settings
from sparkd.commands.statusdoc import Status
from sparkd.daemon.effects.evidence import Counters
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.preflighting import LocalPreflight
from sparkd.daemon.effects.watching import Watching
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.views.facts import DaemonFacts
from sparkd.daemon.views.steps import steps_json
from sparkd.daemon.views.webhooks import Webhooks
from sparkd.daemon.watch.gpus import GpuSampler
from sparkd.guard.guard import Guard
from sparkd.guard.meminfo import MemInfo, read_meminfo
from sparkd.host.clock import Clock, wall_of
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.drainlog import Drain
from sparkd.supervisor.progress import Phase
from sparkd.supervisor.states import SERVING, State, came_up

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

HISTORY = 50


@dataclass(frozen=True)
class Seen:
    """What the views read besides the node's state, each read-only: the senses' last readings (the memory guard,
    the GPU sampler, the instance's watch, the group's peers) and what the effects counted and found (failures, the
    image and its drift, the last preflight)."""

    guard: Guard | None
    gpu: GpuSampler | None
    watching: Watching
    group: Coordinator | None
    counters: Counters
    container: ContainerFacts
    preflight: LocalPreflight


def status_line(state: NodeState, now: float) -> str:
    """The systemd STATUS= line: ``ready, pid 1234, restarts 0``; ``stopping: draining: 3 in flight, 97 s left, …``."""
    m, p, instance = state.machine, state.startup, state.instance
    text = m.state.value
    if m.state is State.starting and instance is not None:
        text += f": {p.phase.value}" + (f" {p.shards_loaded}/{p.shards_total}" if p.shards_total else "")
    if state.drain is not None and m.state is State.stopping:
        text += f": {state.drain.sentence(now)}"
    gate = state.acceptance
    if m.state is State.accepting:
        held = gate.last is not None and gate.last.refuse
        text += f": held, {gate.last.verdict.value}" if held and gate.last else ": the acceptance gate asks"
    if instance is not None:
        text += f", pid {instance.pid}"
    text += f", restarts {m.restarts}"
    if m.last_failure is not None and m.state in (State.backoff, State.failed):
        text += f", last failure {m.last_failure.cls.value}"
    return text


class History:
    """The node's recent states and phases with wall times (so ``sparkctl restart --wait`` shows every step), the
    restarts by what caused them, and how long the last start took: what the views remember of past states."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.entries: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.restarts: Counter[str] = Counter()  # by what caused them: a failure class, operator, reset
        self.last_start_s: float | None = None  # launch to ready, the last time (the ETA of the next)

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        was, now = before.machine, after.machine
        if now.state is not was.state:
            self.entries.append({"at": self.clock.wall(), "state": now.state.value})
        if now.launches > was.launches > 0:
            self.restarts[now.restart_reason or "unknown"] += 1
        if came_up(was.state, now.state) and now.started_at is not None:
            self.last_start_s = round(now.since - now.started_at, 1)
        if after.settling is not None and after.settling != before.settling:
            self.entries.append({"at": self.clock.wall(), "state": now.state.value, "phase": after.settling})
        drain = after.drain
        if drain is not None and isinstance(posted, v.Draining) and _drain_step(before.drain) != _drain_step(drain):
            self.entries.append({"at": self.clock.wall(), "state": now.state.value, "phase": "draining",
                                 "drain": drain.to_json(self.clock.now())})
        startup = after.startup
        if after.instance is not None and isinstance(posted, v.Progress) and startup.phase is not before.startup.phase:
            entry: dict[str, Any] = {"at": self.clock.wall(), "state": now.state.value, "phase": startup.phase.value}
            if startup.phase is Phase.loading_weights and startup.shards_total:
                entry["shards"] = [startup.shards_loaded, startup.shards_total]
            self.entries.append(entry)


def _drain_step(drain: Drain | None) -> tuple[object, ...] | None:
    """What makes a drain's step worth a line of history: its state and the count in flight (not the time left)."""
    return None if drain is None else (drain.state, drain.in_flight)


class StatusView:
    def __init__(self, node: Callable[[], NodeState], seen: Seen, facts: DaemonFacts, history: History,
                 clock: Clock, *, token: str | None, webhooks: Webhooks | None = None) -> None:
        self.node = node  # the loop's: the node's state now
        self.seen = seen
        self.facts = facts
        self.history = history
        self.clock = clock
        self.token = token  # secrets in "shared" are digests under the peers' shared secret
        self.webhooks = webhooks  # [notify]'s targets, and where the runbook is served

    def line(self) -> str:
        return status_line(self.node(), self.clock.now())

    def status(self) -> Status:
        state, seen, clock, now = self.node(), self.seen, self.clock, self.clock.now()
        cfg, m, instance, startup = state.config, state.machine, state.instance, state.startup
        last, group, health = m.last_failure, seen.group, seen.watching.health()
        ready_since = m.restart_state.ready_since
        problems = self.facts.problems()
        return {
            "version": __version__, "node": cfg.node.name, "role": cfg.node.role.value,
            "rank": cfg.node_rank, "gpus_per_node": cfg.cluster.gpus_per_node,
            "runtime": cfg.runtime.value,
            "state": m.state.value, "since": wall_of(clock, m.since), "ready": m.state in SERVING,
            "intent": m.intent.value,
            "pid": instance.pid if instance else None, "container_id": instance.container_id if instance else None,
            "restarts": m.restarts, "launches": m.launches,
            "uptime_s": round(now - ready_since, 1) if ready_since is not None else None,
            "phase": startup.phase.value if instance else None,
            "shards": [startup.shards_loaded, startup.shards_total] if startup.shards_total else None,
            "kv_cache_tokens": startup.kv_cache_tokens, "max_concurrency": startup.max_concurrency,
            "last_start_s": self.history.last_start_s,
            "start_timing": state.timing.to_json() if state.timing is not None else None,
            "health": m.health_note,
            "watch_note": health.watch_note if health is not None else None,
            "steps": steps_json(seen.watching.step_watch(), now),
            "breaker": {"open": m.breaker_open, "reason": m.breaker_reason},
            "backoff_until": wall_of(clock, m.deadline) if m.state is State.backoff else None,
            "last_failure": None if last is None else {
                "class": last.cls.value, "message": last.sentence, "at": seen.counters.failure_at,
                "exit_code": last.exit_code, "signal": last.signal, "evidence": last.evidence},
            "config_hash": cfg.launch_hash(), "daemon_pid": os.getpid(), "updated_at": clock.wall(),
            "daemon": {"degraded": bool(problems), "problems": problems},
            "config": self.facts.config_state(),
            "history": list(self.history.entries),
            "pair": group.role.value if group is not None and group.role else None,
            "shared": shared_settings(cfg, self.token), "image": seen.container.image_json(),
            "image_id": seen.container.image.id if seen.container.image else None, "drift": seen.container.drift,
            "peers": group.peers_json() if group is not None else [],
            "memory": memory(seen.guard),
            "gpu": seen.gpu.status() if seen.gpu is not None else None,
            "last_stop": state.last_stop.to_json() if state.last_stop is not None else None,
            "drain": state.drain.to_json(now) if state.drain is not None else None,
            "acceptance": {"enabled": cfg.acceptance.enabled,
                           **state.acceptance.view(now, lambda at: wall_of(clock, at))},
            # issue 40: where this node serves its runbook, and the webhooks' state
            "runbook": self.webhooks.base if self.webhooks is not None else None,
            "notify": self.webhooks.status() if self.webhooks is not None else None,
            **self.facts.more(),
            **self.facts.proofs(),
        }


def memory(guard: Guard | None) -> dict[str, Any]:
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
