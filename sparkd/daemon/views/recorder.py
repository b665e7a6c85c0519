"""The daemon's flight recorder: one record every ``[recorder] interval_s`` from what the daemon already knows.

Each tick, on the daemon's own loop (no new process, no new service), :class:`DaemonRecorder` reads MemAvailable,
MemFree and swap (one ``preadv`` of ``/proc/meminfo``) and PSI, and takes the rest from objects the daemon keeps
anyway: the guard's level, action, leak trend and the kernel lines it kept (OOM, NVRM, Xid, AER), the lifecycle
state, vLLM's startup phase, its last metrics scrape (running and waiting requests, KV usage, prompt tokens/s from
``vllm:prompt_tokens_total``), each peer's last heartbeat and clock offset, and what happened since the last
record (transitions, guard actions, peers lost and back). It packs the record and hands it to the writer thread
(:class:`sparkd.recorder.writer.RingWriter`). GPU power and utilization come through the ``gpu`` hook (issue 27's
NVML view fills it; until then they are unknown). With ``hardware_watchdog`` it arms the watchdog once the ring
is synced and pets it while the supervising loop moves.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd import __version__
from sparkd.commands import recorder
from sparkd.config import Config, Role
from sparkd.daemon.effects.slot import InstanceSlot
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.daemon.loop.supervisor import Supervisor
from sparkd.daemon.watch.memory import MemorySampler, read_boot_id
from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock
from sparkd.recorder.excerpt import records_between, summaries
from sparkd.recorder.record import Floors, PeerMark, Record, encode
from sparkd.recorder.watchdog import Watchdog, WatchdogError
from sparkd.recorder.writer import RingWriter
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import Machine, State

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

__all__ = ["DaemonRecorder", "GpuReading", "flight_records", "own_records", "ring_path"]

MAX_EVENTS = 64  # events waiting for the next record (a storm of transitions keeps the newest)
PEER_RECORDS_TIMEOUT_S = 30.0
PROMPT_RATE_STALE_S = 15.0  # a prompt-token counter that has not moved for this long: 0 tokens/s
GpuReading = Callable[[], tuple[float | None, float | None]]  # (power W, utilization %); issue 27's NVML view


def ring_path(cfg: Config) -> Path:
    return cfg.recorder.path or cfg.paths.state_dir / "recorder.ring"


class DaemonRecorder:
    def __init__(self, config: CurrentConfig, sup: Supervisor, node: InstanceSlot, memory: MemorySampler,
                 clock: Clock, log: Any, *, guard: Guard | None, group: Coordinator | None) -> None:
        self.config = config  # the ring's path and size apply at the next daemon start
        cfg = config()
        self.sup = sup
        self.node = node
        self.clock = clock
        self.log = log
        self.guard = guard
        self.group = group
        self.gpu: GpuReading = lambda: (None, None)
        self.boot = memory.boot
        self.run_id = int.from_bytes(os.urandom(4), "little")
        self.writer = RingWriter(ring_path(cfg), cfg.recorder.ring_size, sync_interval_s=cfg.recorder.sync_interval_s,
                                 log=log)
        self.memory = memory
        self.phase: str | None = None  # memory_settle while the settle waits
        self.events: deque[str] = deque(maxlen=MAX_EVENTS)
        self.records = 0
        self.cpu_s = 0.0  # CPU time its ticks took on the loop (the writer thread counts its own)
        self.watchdog = Watchdog(cfg.recorder.watchdog_device, cfg.recorder.watchdog_timeout_s) \
            if cfg.recorder.hardware_watchdog else None
        self.watchdog_problem: str | None = None
        self._kernel_mark: int | None = None
        self._peers_up: dict[str, bool] = {}
        self._guard_action: str | None = None
        self._prompt: tuple[float, float, float] | None = None  # (counter, monotonic time it moved, rate)
        self._closed = False
        sup.listeners.append(self._on_change)
        self.note(f"sparkd {__version__} started (pid {os.getpid()}, boot {self.boot[:8]})")

    # ---- events

    @property
    def cfg(self) -> Config:
        return self.config()

    def note(self, text: str) -> None:
        self.events.append(text)

    def _on_change(self, before: Machine, after: Machine, obs: v.Observation) -> None:
        if after.state is before.state:
            return
        text = f"{before.state.value} → {after.state.value}"
        failure = after.answering or (after.last_failure if after.state in (State.backoff, State.failed) else None)
        if failure is not None and (after.state is State.stopping or after.state is State.failed
                                    or after.last_failure is not before.last_failure):
            text += f": {failure.cls.value}: {failure.sentence[:300]}"
        self.note(text)

    # ---- one record
    def record(self, *, clean_exit: bool = False) -> Record:
        now = self.clock.now()
        memory = self.memory.read()
        guard = self.guard
        machine, node = self.sup.machine, self.node
        metrics = node.watch.vllm_metrics if node.watch is not None else None
        power, util = self._gpu()
        return Record(
            wall=self.clock.wall(), mono=now, boot=self.boot, run=self.run_id, **memory,
            **self._guard_fields(guard), state=machine.state.value,
            phase=self.phase or (node.startup.phase.value if node.instance is not None else None),
            running=_int(metrics.num_requests_running) if metrics is not None else None,
            waiting=_int(metrics.num_requests_waiting) if metrics is not None else None,
            prompt_tps=self._prompt_rate(metrics.prompt_tokens_total if metrics is not None else None, now),
            kv_usage=metrics.kv_cache_usage_perc if metrics is not None else None,
            gpu_power_w=power, gpu_util=util, pid=node.instance.pid if node.instance is not None else None,
            restarts=machine.restarts, floors=Floors(self.cfg.guard.warn_below, self.cfg.guard.stop_below,
                                                     self.cfg.guard.kill_below),
            clean_exit=clean_exit, peers=self._peers(now), kernel=self._kernel_lines(guard),
            events=self._take_events())

    def _guard_fields(self, guard: Guard | None) -> dict[str, Any]:
        if guard is None or guard.decision is None:
            return {}
        decision, trend = guard.decision, guard.trend
        action = decision.action.value
        if action != self._guard_action:
            if action != "ok":
                self.note(f"guard {action}: {decision.reason}")
            self._guard_action = action
        return {"guard_level": decision.level.name, "guard_action": action,
                "trend_slope": trend.slope if trend is not None else None,
                "trend_floor_s": trend.seconds_to_floor if trend is not None else None}

    def _kernel_lines(self, guard: Guard | None) -> tuple[str, ...]:
        kernel = guard.sampler.kernel if guard is not None else None
        if kernel is None:
            return ()
        new = kernel.kept - (self._kernel_mark if self._kernel_mark is not None else kernel.kept)
        self._kernel_mark = kernel.kept
        return tuple(list(kernel.lines)[-new:]) if new > 0 else ()

    def _peers(self, now: float) -> tuple[PeerMark, ...]:
        if self.group is None:
            return ()
        marks = []
        for peer, view in self.group.views.items():
            name = str((view.status or {}).get("node") or peer)
            up = view.reachable
            if self._peers_up.get(peer, True) != up:
                self.note(f"peer {name} ({peer}) " + ("answers again" if up else "does not answer"))
            self._peers_up[peer] = up
            age = now - view.last_seen if view.last_seen is not None else None
            marks.append(PeerMark(name, age, view.offset_s, up))
        return tuple(marks)

    def _prompt_rate(self, total: float | None, now: float) -> float | None:
        if total is None:
            return None
        last = self._prompt
        if last is None or total < last[0]:
            mark = (total, now, 0.0)
        elif total > last[0]:
            mark = (total, now, (total - last[0]) / max(now - last[1], 1e-3))
        else:
            mark = (last[0], last[1], 0.0 if now - last[1] > PROMPT_RATE_STALE_S else last[2])
        self._prompt = mark
        return mark[2]

    def _gpu(self) -> tuple[float | None, float | None]:
        try:
            return self.gpu()
        except Exception:  # a GPU reading never costs a record
            return None, None

    def _take_events(self) -> tuple[str, ...]:
        taken = tuple(self.events)
        self.events.clear()
        return taken

    # ---- the loop
    async def run(self) -> None:
        """Record every interval until cancelled; the clean exit's record is written by :meth:`close`."""
        self.writer.start()
        while True:
            self.tick()
            await self.clock.sleep(self.cfg.recorder.interval_s)

    def tick(self) -> None:
        started = time.thread_time()
        try:
            payload = encode(self.record())
        except Exception as exc:  # a record that cannot be made is logged, never the end of the daemon
            self.log.error("recorder_record_failed", error=repr(exc))
            return
        if self.writer.put(payload):
            self.records += 1
        self._watchdog()
        self.cpu_s += time.thread_time() - started

    def _watchdog(self) -> None:
        dog = self.watchdog
        if dog is None or self.writer.synced_at is None:
            return
        try:
            if not dog.armed:
                dog.arm()
                self.log.warning("watchdog_armed", device=str(dog.device), timeout_s=dog.timeout_s,
                                 driver_timeout_s=dog.timeout_set)
                self.note(f"hardware watchdog {dog.device} armed ({dog.timeout_s} s)")
            elif self.clock.now() - self.sup.alive_at <= dog.timeout_s / 2:
                dog.pet()
            self.watchdog_problem = None
        except (OSError, WatchdogError) as exc:
            if self.watchdog_problem is None:
                self.log.error("watchdog_failed", error=str(exc))
            self.watchdog_problem = str(exc)

    async def close(self) -> None:
        """The clean exit: one last record that says so, written and synced; the watchdog disarmed."""
        if self._closed:
            return
        self._closed = True
        self.note(f"sparkd exits cleanly ({self.sup.machine.state.value})")
        with contextlib.suppress(Exception):
            self.writer.put(encode(self.record(clean_exit=True)))
        await anyio.to_thread.run_sync(self.writer.close)
        if self.watchdog is not None:
            self.watchdog.disarm()
        self.memory.close()

    # ---- for status and metrics
    def problems(self) -> list[str]:
        return [p for p in (self.writer.problem, self.watchdog_problem) if p]

    def status(self) -> dict[str, Any]:
        return {"path": str(self.writer.path), "records": self.records, "written": self.writer.written,
                "cpu_s": round(self.cpu_s + self.writer.cpu_s, 6),
                "dropped": self.writer.dropped, "syncs": self.writer.syncs, "problem": self.writer.problem,
                "watchdog": None if self.watchdog is None else {"armed": self.watchdog.armed,
                                                               "pets": self.watchdog.pets}}


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


# ---- what `sparkctl postmortem` reads (sparkd.commands.recorder)


def own_records(cfg: Config, since: float | None, until: float | None) -> dict[str, Any]:
    """This node's runs (and records in ``[since, until]`` when ``until`` is given), for the recorder command."""
    out: dict[str, Any] = {"node": cfg.node.name, "rank": cfg.node_rank if cfg.node.role is not Role.single else None,
                           "role": cfg.node.role.value, "now": time.time(), "interval_s": cfg.recorder.interval_s,
                           "boot": read_boot_id(cfg.recorder.boot_id_path), "runs": [], "records": []}
    path = ring_path(cfg)
    try:
        out["runs"] = [r.to_json() for r in summaries(path, since)]
        if until is not None:
            out["records"] = records_between(path, since if since is not None else 0.0, until)
    except OSError as exc:
        out["error"] = f"cannot read the ring {path}: {exc.strerror or exc}"
    return out


async def flight_records(cfg: Config, group: Coordinator | None, *, since: float | None,
                         until: float | None) -> dict[str, Any]:
    """This node's answer and, with ``group``, every peer's (asked in parallel through the peer API)."""
    own = await anyio.to_thread.run_sync(own_records, cfg, since, until)
    nodes: list[dict[str, Any]] = [own]
    if group is not None:
        from sparkd.cluster.peers import PeerRefused, PeerUnreachable

        async def one(peer: str) -> None:
            known = (group.views[peer].status or {}).get("node") if peer in group.views else None
            try:
                answer = await group.client.call(peer, recorder.COMMAND, recorder.Request(since, until, local=True),
                                                 retries=1, timeout_s=PEER_RECORDS_TIMEOUT_S)
                theirs = answer.get("nodes")
                nodes.extend({**n, "peer": peer} for n in (theirs if isinstance(theirs, list) else [])
                             if isinstance(n, dict))
            except (PeerUnreachable, PeerRefused) as exc:
                nodes.append({"node": known or peer, "peer": peer, "error": str(exc), "runs": [], "records": []})

        async with anyio.create_task_group() as tg:
            for peer in group.client.peers:
                tg.start_soon(one, peer)
    return {"reference": own["node"], "nodes": nodes}
