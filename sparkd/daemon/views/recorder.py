"""The daemon's flight recorder: one record every ``[recorder] interval_s`` from what the daemon already knows.

Each tick, on the daemon's own loop (no new process, no new service), :class:`DaemonRecorder` takes MemAvailable,
MemFree, swap and PSI from the memory guard's sample it rides on (right after it, in the guard's wake-up), or reads
them itself (one ``preadv`` of ``/proc/meminfo`` and PSI, :mod:`sparkd.daemon.watch.memory`), and takes the
rest from what the daemon keeps anyway: the node's state (the lifecycle state, vLLM's startup phase or the memory
settle, its PID, the restarts, the guard's floors in force), the guard's level, action, leak trend and the kernel
lines it kept (OOM, NVRM, Xid, AER), vLLM's last metrics scrape (running and waiting requests, KV usage, prompt
tokens/s from ``vllm:prompt_tokens_total``), the GPU sampler's last reading of the launch's GPUs (power,
utilization and memory of each), each peer's last heartbeat and clock offset, and what happened since the last
record (transitions, guard actions, peers lost and back). It packs the record and hands it to the writer thread
(:class:`sparkd.recorder.writer.RingWriter`). With ``hardware_watchdog`` it arms the watchdog once the ring is
synced and pets it while the supervising loop moves.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from sparkd import __version__
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.views.flightrecords import ring_path
from sparkd.daemon.views.status import Seen
from sparkd.daemon.watch.memory import MemorySampler
from sparkd.guard.guard import Guard
from sparkd.guard.sample import Sample
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.host.waits import Alarm
from sparkd.recorder.record import Floors, GpuMark, PeerMark, Record, encode
from sparkd.recorder.watchdog import Watchdog, WatchdogError
from sparkd.recorder.writer import RingWriter
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import State

__all__ = ["DaemonRecorder", "gpu_marks"]

MAX_EVENTS = 64  # events waiting for the next record (a storm of transitions keeps the newest)
PROMPT_RATE_STALE_S = 15.0  # a prompt-token counter that has not moved for this long: 0 tokens/s
RIDE_EARLY = 0.05  # a guard sample this share of the interval early still makes the record (a PSI wake-up)
RIDE_LATE = 3.0  # intervals without a guard sample before the recorder records on its own


class DaemonRecorder:
    def __init__(self, node: Callable[[], NodeState], seen: Seen, memory: MemorySampler, clock: Clock, log: Logger,
                 *, alive_at: Callable[[], float]) -> None:
        """``alive_at``: when the supervising loop last moved (the hardware watchdog is petted only while it does)."""
        self.node = node  # the loop's: the node's state now
        self.seen = seen
        self.memory = memory
        self.clock = clock
        self.log = log
        self.alive_at = alive_at
        cfg = node().config  # the ring's path and size apply at the next daemon start
        self.boot = memory.boot
        self.run_id = int.from_bytes(os.urandom(4), "little")
        self.writer = RingWriter(ring_path(cfg), cfg.recorder.ring_size, sync_interval_s=cfg.recorder.sync_interval_s,
                                 log=log)
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
        self.note(f"sparkd {__version__} started (pid {os.getpid()}, boot {self.boot[:8]})")

    # ---- events
    def note(self, text: str) -> None:
        self.events.append(text)

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        was, now = before.machine, after.machine
        if now.state is was.state:
            return
        text = f"{was.state.value} → {now.state.value}"
        failure = now.answering or (now.last_failure if now.state in (State.backoff, State.failed) else None)
        if failure is not None and (now.state is State.stopping or now.state is State.failed
                                    or now.last_failure is not was.last_failure):
            text += f": {failure.cls.value}: {failure.sentence[:300]}"
        self.note(text)

    # ---- one record
    def record(self, *, clean_exit: bool = False, taken: Sample | None = None) -> Record:
        """``taken``: the memory guard's sample of this moment (else meminfo and PSI are read here)."""
        now = self.clock.now()
        memory = self.memory.read(taken)
        state, guard = self.node(), self.seen.guard
        machine, floors = state.machine, state.config.guard
        metrics = self.seen.watching.metrics()
        gpus = self._gpus()
        power = [g.power_w for g in gpus if g.power_w is not None]
        util = [g.util_pct for g in gpus if g.util_pct is not None]
        return Record(
            wall=self.clock.wall(), mono=now, boot=self.boot, run=self.run_id, **memory,
            **self._guard_fields(guard), state=machine.state.value,
            phase=state.settling or (state.startup.phase.value if state.instance is not None else None),
            running=_int(metrics.num_requests_running) if metrics is not None else None,
            waiting=_int(metrics.num_requests_waiting) if metrics is not None else None,
            prompt_tps=self._prompt_rate(metrics.prompt_tokens_total if metrics is not None else None, now),
            kv_usage=metrics.kv_cache_usage_perc if metrics is not None else None,
            gpu_power_w=sum(power) if power else None, gpu_util=statistics.mean(util) if util else None,
            pid=state.instance.pid if state.instance is not None else None,
            restarts=machine.restarts, floors=Floors(floors.warn_below, floors.stop_below, floors.kill_below),
            clean_exit=clean_exit, peers=self._peers(now), kernel=self._kernel_lines(guard),
            events=self._take_events(), gpus=gpus)

    def _gpus(self) -> tuple[GpuMark, ...]:
        try:
            return gpu_marks(self.seen.gpu)
        except Exception:  # a GPU reading never costs a record
            return ()

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
        group = self.seen.group
        if group is None:
            return ()
        marks = []
        for peer, view in group.views.items():
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
            await self._until_due()

    async def _until_due(self) -> None:
        """Until the next record of the recorder's own is due. Where this daemon's memory guard samples at least as
        often as the recorder records, the records ride its steps instead (:meth:`_ride`)."""
        interval, guard = self.node().config.recorder.interval_s, self.seen.guard
        if guard is None or not self._rides(guard, interval):
            await self.clock.sleep(interval)
            return
        await self._ride(guard, interval)

    def _rides(self, guard: Guard, interval: float) -> bool:
        return guard.sampling and guard.cfg.max_interval_s <= interval and \
            self.node().config.recorder.interval_s == interval

    async def _ride(self, guard: Guard, interval: float) -> None:
        """Each record is made in the guard's wake-up, right after the step that falls due, from its sample (the
        guard's ``after_step``): one wake-up and one reading of meminfo and PSI serve both. This task sleeps until
        RIDE_LATE intervals passed without such a record (the guard's loop ended, or an action of its holds it: an
        alarm each record pushes back, so the task does not wake while the guard steps), or until a step finds that
        riding no longer applies; then it returns, for a record of the recorder's own."""
        def next_due() -> float:
            return guard.clock() + interval * (1 - RIDE_EARLY)

        due, late = next_due(), Alarm(interval * RIDE_LATE)

        def after_step(sample: Sample | None) -> None:
            nonlocal due
            if not self._rides(guard, interval):
                late.set()
            elif guard.clock() >= due:
                due = next_due()
                late.reset()
                self.tick(sample)

        guard.after_step = after_step
        try:
            await late.wait()
        finally:
            late.cancel()
            guard.after_step = None

    def tick(self, taken: Sample | None = None) -> None:
        started = time.thread_time()
        try:
            payload = encode(self.record(taken=taken))
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
            elif self.clock.now() - self.alive_at() <= dog.timeout_s / 2:
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
        self.note(f"sparkd exits cleanly ({self.node().machine.state.value})")
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

    def counts(self) -> tuple[int, int, int]:
        return self.writer.written, self.writer.dropped, self.writer.syncs


def gpu_marks(gpu: Any) -> tuple[GpuMark, ...]:
    """The launch's GPUs as the sampler last read them (none without a sampler or a reading)."""
    if gpu is None:
        return ()
    return tuple(GpuMark(d.index, d.power_w, None if d.utilization_pct is None else float(d.utilization_pct),
                         d.used_bytes, d.total_bytes) for d in gpu.launch_devices())


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
