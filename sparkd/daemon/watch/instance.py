"""Watching one instance: its log lines, its exit (event-driven), and its HTTP health.

An :class:`InstanceWatch` lives from launch (or adoption) until the instance is stopped. It only observes
and posts observations; it never decides. It owns the health tracker (one task updates it) and shows it,
with the last vLLM metrics, read-only to whoever reports.
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import anyio

from sparkd.config import HealthConfig
from sparkd.daemon.watch.clientconns import BOTH, open_clients
from sparkd.daemon.watch.steps import StepSense
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.host.waits import Flag
from sparkd.runtime.base import Instance, Runtime
from sparkd.supervisor import health
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.deathlog import EXPLAINED, told_by_the_log
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import HealthTracker
from sparkd.supervisor.healthsignal import Probes, Signal
from sparkd.supervisor.logline import clean
from sparkd.supervisor.peerloss import names_peer_loss
from sparkd.supervisor.readings import VllmMetrics
from sparkd.supervisor.signals import SIGNALS
from sparkd.supervisor.signals.canary import CANARY
from sparkd.supervisor.states import SERVING, UP, State
from sparkd.supervisor.stepwatch import (
    READ_EVERY_S,
    StepWatch,
    canary_every,
    canary_pending,
    observe_steps,
    read_due,
    read_wait,
)

READY_POLL_S = 0.5  # /health while starting: the port refuses until vLLM is ready, so this is cheap
DRAIN_S = 5.0  # after an exit, how long the log may take to deliver its last lines before classifying


# (exit code, signal, hint, engine gone): the engine gone means no new connection to it when vLLM ended
ClassifyExit = Callable[[int | None, int | None, FailureClass | None, bool], Awaitable[Failure]]
LineSink = Callable[[str, bool], None]  # (line, persist): persist False for lines replayed at adoption


class WatchReports(Protocol):
    """Who the watch tells what it sees (the node's :class:`sparkd.daemon.effects.watching.NodeWatchReports`, or a
    fake)."""

    def post(self, obs: v.Observation) -> None: ...

    def state(self) -> State: ...

    def on_line(self, line: str, persist: bool = True) -> None: ...

    async def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                            engine_gone: bool = False) -> Failure: ...

    async def head_stops_the_group(self) -> bool:
        """A worker's: whether its head's sparkd says it stops the group (always False elsewhere)."""


@dataclass(frozen=True)
class Watched:
    """The instance a watch watches, and how: its ranks' layout (the health's topology), vLLM's API port where its
    clients' connections can be counted (None: not countable from here), whether the log so far is replayed
    (an adopted instance's: its lines are not kept again), the health signals it runs
    (sparkd.supervisor.signals), and the step probe's sense with the identity whose step history it keeps (None:
    the probe is not read)."""

    instance: Instance
    replay: bool = False
    topology: health.Topology = health.Topology.group
    clients_port: int | None = None
    clients_families: tuple[int, ...] = BOTH  # the address families vLLM's API socket accepts (clientconns)
    signals: tuple[Signal[Any], ...] = SIGNALS  # besides /health and /metrics
    steps: StepSense | None = None
    step_identity: str = ""


class InstanceWatch:
    def __init__(self, watched: Watched, runtime: Runtime, reports: WatchReports, probes: Probes | None,
                 settings: Callable[[], HealthConfig], clock: Clock, log: Logger) -> None:
        """``settings``: ``[health]`` as it applies now (a reload changes it from the next probe on)."""
        instance = self.instance = watched.instance
        self.runtime = runtime
        self.post = reports.post
        self.state = reports.state
        self.on_line: LineSink = reports.on_line
        self.classify_exit: ClassifyExit = reports.classify_exit
        self.head_stops_the_group = reports.head_stops_the_group
        self.probes = probes  # None: a headless rank serves no HTTP
        self.settings = settings
        self.clock = clock
        self.log = log
        self.health = HealthTracker(topology=watched.topology)
        self.clients_port = watched.clients_port  # vLLM's API port, where its clients' connections can be counted
        self.clients_families = watched.clients_families
        replay = watched.replay
        self.signals = watched.signals  # besides /health and /metrics (sparkd.supervisor.signals)
        self._own_out = 0  # probes of ours in flight on vLLM's API port (their connections are no client's)
        self._clients_at: float | None = None  # when they were last counted
        self.steps = watched.steps  # the step probe's sense (issue 38)
        self.step_identity = watched.step_identity
        self.step_watch = StepWatch()
        self._canary_sent: float | None = None  # the canary in flight: when it was sent
        self._canary_out = Flag()  # set when a canary is sent: wakes the step watch resting between reads
        self.vllm_metrics: VllmMetrics | None = None
        self._head_stop_seen = False  # this rank lost its head to the head's own stop of the group
        self.exited = Flag()
        self.logs_drained = anyio.Event()
        self.closed = anyio.Event()
        self.scope = anyio.CancelScope()
        self._replay_bytes = _size(instance.log_path) if replay else 0

    @property
    def cfg(self) -> HealthConfig:
        return self.settings()

    async def run(self) -> None:
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._follow_logs)
                    tg.start_soon(self._see_exit)
                    tg.start_soon(self._watch_exit)
                    if self.probes is not None:
                        tg.start_soon(self._probe_health)
                        for signal in self.signals:
                            tg.start_soon(self._run_signal, signal)
                        if self.steps is not None:
                            tg.start_soon(self._watch_steps, self.steps)
        finally:
            if self.steps is not None:
                self.steps.keep_history(self.step_identity, self.step_watch.history, now=True)
            if self.probes is not None:
                with anyio.CancelScope(shield=True):
                    await self.probes.aclose()
            self.closed.set()

    async def close(self) -> None:
        self.scope.cancel()
        await self.closed.wait()

    async def _follow_logs(self) -> None:
        consumed = 0
        async for line in self.runtime.follow_logs(self.instance, self.exited):
            consumed += len(line.encode("utf-8", "replace")) + 1
            live = consumed > self._replay_bytes
            self.on_line(line, live)
            if self.probes is None and self._peer_lost(line) and not await self._the_heads_stop("log"):
                self.post(v.HealthFailed(await self.classify_exit(None, None, FailureClass.peer_lost, False)))
            elif self.probes is not None and live:  # vLLM's throughput and JIT lines move the wedge clock
                await self._observe(health.observe_log_line, line)
        self.logs_drained.set()

    def _peer_lost(self, line: str) -> bool:
        if self.state() not in SERVING:
            return False
        return names_peer_loss(clean(line))  # a headless rank whose head went away hangs printing these

    async def _watch_exit(self) -> None:
        info = await self.runtime.wait(self.instance)
        self.exited.set()
        with anyio.move_on_after(DRAIN_S):
            await self.logs_drained.wait()
        if self.state() is State.stopping or self._head_stop_seen:
            self.log.info("exited", pid=self.instance.pid, exit=info.describe(), requested=True)
            return
        engine_gone = not await self.runtime.engine_answers()  # it stopped, taking vLLM's container along
        failure = await self.classify_exit(info.exit_code, info.signal, None, engine_gone)
        if failure.cls is FailureClass.peer_lost and await self._the_heads_stop("exit"):
            self.log.info("exited", pid=self.instance.pid, exit=info.describe(), requested=True)
            return
        self.log.warning("exited", pid=self.instance.pid, exit=info.describe(), failure=failure.cls.value)
        self.post(v.Exited(failure))

    async def _the_heads_stop(self, seen: str) -> bool:
        """A headless rank that lost its head (``seen`` in its log, or its exit read as that loss): True, and stopped
        as the head's order would stop it, when the head's sparkd says it stops the group — the head's rank ends
        on purpose the moment its requests are done, before its order reaches this node. Else the loss is a
        failure, as it was. Only a loss of the head is asked about: a rank's own death is never the head's stop."""
        if self._head_stop_seen:
            return True
        if self.probes is not None or not await self.head_stops_the_group():
            return False
        self._head_stop_seen = True
        self.log.info("head_stops_the_group", pid=self.instance.pid, seen=seen)
        self.post(v.StopRequested())
        return True

    async def _see_exit(self) -> None:
        """Log ``exit_seen`` the moment the kernel reports the death: a thread blocked on a pidfd, so a busy loop
        (vLLM's last lines arriving, a status render) never delays sparkd's record of it. The exit status, the
        log's last lines and the classification follow on the loop (``_watch_exit``)."""
        try:
            pidfd = os.pidfd_open(self.instance.pid)
        except OSError:
            return  # gone already (an adopted instance that just died) or not ours to watch
        wake_r, wake_w = os.pipe()
        pid, log = self.instance.pid, self.log

        def block() -> None:
            try:
                ready, _, _ = select.select([pidfd, wake_r], [], [])
                if pidfd in ready:
                    log.info("exit_seen", pid=pid)
            finally:
                for fd in (pidfd, wake_r):
                    os.close(fd)

        try:
            await anyio.to_thread.run_sync(block, abandon_on_cancel=True)
        finally:
            with contextlib.suppress(OSError):  # the thread may be done already (its end of the pipe closed)
                os.write(wake_w, b"x")  # a closed watch: the thread returns
            os.close(wake_w)

    async def _probe_health(self) -> None:
        """Readiness while starting (cheap: the port refuses), then /health and vLLM's metrics (from the acceptance
        gate on: vLLM answers)."""
        assert self.probes is not None
        while True:
            serving = self.state() in UP
            await self._observe(health.observe_health, await self.probes.health())
            if serving:
                now = self.clock.now()
                if self.clients_port is not None and health.clients_due(self.health, now, self._clients_at,
                                                                        self._canary_sent):
                    self._clients_at = now
                    await self._count_clients(self.clients_port)
                metrics = await self.probes.metrics()
                self.vllm_metrics = metrics if isinstance(metrics, VllmMetrics) else None
                await self._observe(health.observe_metrics, metrics)
            await self.clock.sleep(self.cfg.interval_s if serving else READY_POLL_S)

    async def _count_clients(self, port: int) -> None:
        """Other clients' requests waiting on vLLM now (a probe of ours in flight, the canary's, is not one)."""
        own_out = self._own_out
        n = await anyio.to_thread.run_sync(partial(open_clients, port, families=self.clients_families))
        if n is not None and own_out:
            n = max(0, n - own_out)
        self.health = health.observe_clients(self.health, n)

    async def _run_signal(self, signal: Signal[Any]) -> None:
        """One signal's loop: every ``every_s``, while vLLM serves and ``[health]`` in force has the signal on, its
        probe, then its rule."""
        assert self.probes is not None
        canary = signal.name == CANARY.name
        while True:
            every = signal.every_s(self.cfg)
            await self.clock.sleep(canary_every(self.step_watch, every) if canary else every)
            if self.state() in SERVING and signal.on(self.cfg):
                self._own_out += signal.own_connection
                if canary:
                    self._canary_sent = self.clock.now()
                    self._canary_out.set()
                try:
                    reading = await signal.probe(self.probes)
                finally:
                    self._own_out -= signal.own_connection
                    if canary:
                        self._canary_sent = None
                        self._canary_out = Flag()
                await self._observe(signal.rule, reading)

    async def _watch_steps(self, sense: StepSense) -> None:
        """The step probe (issue 38): every rank's step records, read every second while vLLM serves, folded into the
        health beside the other signals (sparkd.supervisor.stepwatch); the identity's step history learned."""
        sense.forget()  # an earlier instance's readings are no one's now
        self.step_watch = StepWatch(history=sense.load_history(self.step_identity))
        last_read: float | None = None
        wait = READ_EVERY_S
        while True:
            await self._pause_steps(wait)
            wait = READ_EVERY_S
            if self.state() not in (*SERVING, State.stopping) or not self.health.watching:
                continue  # read on while a stop drains: a wedge found then cuts the drain (lifecycle rule 10)
            pending = canary_pending(self._canary_sent)
            wait = read_wait(self.step_watch, self.clock.now(), last_read, pending)
            if not read_due(self.step_watch, self.clock.now(), last_read, pending):
                continue  # every rank rests: read every RESTING_READ_S
            last_read = self.clock.now()
            nodes = await sense.readings()
            self.step_watch, self.health, obs = observe_steps(
                self.step_watch, self.health, nodes, self.clock.now(), self.cfg, pending=pending)
            sense.keep_history(self.step_identity, self.step_watch.history)
            wait = read_wait(self.step_watch, self.clock.now(), last_read, pending)
            await self._post(obs)

    async def _pause_steps(self, seconds: float) -> None:
        """The step watch's sleep: ``seconds``, or less where a canary is sent meanwhile (it makes a read due)."""
        if seconds <= READ_EVERY_S:
            await self.clock.sleep(seconds)
            return
        with self._canary_out.interrupts():
            await self.clock.sleep(seconds)

    async def _observe(self, observe: Callable[..., health.Step], result: object) -> None:
        self.health, obs = observe(self.health, result, self.clock.now(), self.cfg)
        await self._post(obs)

    async def _post(self, obs: v.Observation | None) -> None:
        """A verdict of the health signals; a probe's death or wedge that vLLM's log names otherwise is the log's."""
        if isinstance(obs, v.HealthFailed) and obs.failure.cls in EXPLAINED:
            told = await self.classify_exit(None, None, FailureClass.engine_dead, False)  # the log's tail, as a death
            obs = replace(obs, failure=told_by_the_log(obs.failure, told))
        if obs is not None:
            self.post(obs)


def _size(path: str | None) -> int:
    if not path:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
