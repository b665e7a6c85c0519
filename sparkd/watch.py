"""Watching one instance: its log lines, its exit (event-driven), and its HTTP health.

An :class:`InstanceWatch` lives from launch (or adoption) until the instance is stopped. It only observes
and posts observations to the daemon's queue; it never decides.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from sparkd import probes
from sparkd.runtime.base import Instance
from sparkd.supervisor import health
from sparkd.supervisor import machine as sm
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.logline import clean

if TYPE_CHECKING:
    from sparkd.daemon import Daemon

READY_POLL_S = 0.5  # /health while starting: the port refuses until vLLM is ready, so this is cheap

# A headless rank whose head went away hangs forever printing these (reference §5.3).
PEER_LOST_MARKERS = ("Connection was likely closed. Did the remote server shutdown or crash?",
                     "TCPStore server has shut down")


class InstanceWatch:
    def __init__(self, daemon: Daemon, instance: Instance, *, replay: bool) -> None:
        self.daemon = daemon
        self.instance = instance
        self.exited = anyio.Event()
        self.logs_drained = anyio.Event()
        self.scope = anyio.CancelScope()
        self.closed = anyio.Event()
        self.hint: FailureClass | None = None
        self._replay_bytes = _size(instance.log_path) if replay else 0

    async def run(self) -> None:
        with self.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._follow_logs)
                tg.start_soon(self._watch_exit)
                if not self.daemon.headless:
                    tg.start_soon(self._probe)
        self.closed.set()

    async def close(self) -> None:
        self.scope.cancel()
        await self.closed.wait()

    async def _follow_logs(self) -> None:
        consumed = 0
        async for line in self.daemon.runtime.follow_logs(self.instance, self.exited):
            consumed += len(line.encode("utf-8", "replace")) + 1
            self.daemon.on_log_line(line, persist=consumed > self._replay_bytes)
            if self.daemon.headless and self._peer_lost(line):
                failure = self.daemon.classify_exit(None, None, FailureClass.peer_lost)
                self.daemon.post(sm.HealthFailed(failure))
        self.logs_drained.set()

    def _peer_lost(self, line: str) -> bool:
        if self.daemon.machine.state not in sm.SERVING:
            return False
        text = clean(line)
        return any(marker in text for marker in PEER_LOST_MARKERS)

    async def _watch_exit(self) -> None:
        info = await self.daemon.runtime.wait(self.instance)
        self.exited.set()
        with anyio.move_on_after(5.0):
            await self.logs_drained.wait()
        if self.daemon.machine.state is sm.State.stopping:
            self.daemon.log.info("exited", pid=self.instance.pid, exit=info.describe(), requested=True)
            return
        failure = self.daemon.classify_exit(info.exit_code, info.signal, self.hint)
        self.daemon.log.info("exited", pid=self.instance.pid, exit=info.describe(), failure=failure.cls.value)
        self.daemon.post(sm.Exited(failure))

    async def _probe(self) -> None:
        """Readiness while starting, then the health layers; one task owns the (immutable) tracker."""
        cfg = self.daemon.cfg
        base = probes.probe_base_url(cfg.launch.host, cfg.launch.port)
        send, receive = anyio.create_memory_object_stream[tuple[str, object, float]](100)
        async with probes.make_client() as client, anyio.create_task_group() as tg:
            tg.start_soon(self._health_loop, client, base, send)
            if cfg.health.canary:
                tg.start_soon(self._canary_loop, client, base, send.clone())
            tracker = health.HealthTracker()
            async for kind, result, now in receive:
                if kind == "health":
                    tracker, obs = health.observe_health(tracker, result, now, cfg.health)  # type: ignore[arg-type]
                elif kind == "metrics":
                    self.daemon.last_vllm_metrics = result  # type: ignore[assignment]
                    tracker, obs = health.observe_metrics(tracker, result, now, cfg.health)  # type: ignore[arg-type]
                else:
                    tracker, obs = health.observe_canary(tracker, result, now, cfg.health)  # type: ignore[arg-type]
                self.daemon.health = tracker
                self._post_health(obs)

    async def _health_loop(self, client: httpx.AsyncClient, base: str, send: Any) -> None:
        hc = self.daemon.cfg.health
        async with send:
            while True:
                serving = self.daemon.machine.state in sm.SERVING
                result = await probes.probe_health(client, base, hc.timeout_s)
                await send.send(("health", result, time.monotonic()))
                if serving:
                    metrics = await probes.scrape_vllm_metrics(client, base, hc.timeout_s)
                    await send.send(("metrics", metrics, time.monotonic()))
                await anyio.sleep(hc.interval_s if serving else READY_POLL_S)

    async def _canary_loop(self, client: httpx.AsyncClient, base: str, send: Any) -> None:
        hc = self.daemon.cfg.health
        api_key = self.daemon.cfg.launch.api_key
        async with send:
            while True:
                await anyio.sleep(hc.canary_interval_s)
                if self.daemon.machine.state not in sm.SERVING:
                    continue
                result = await probes.probe_canary(client, base, self.daemon.cfg.served_name,
                                                   hc.canary_timeout_s, api_key=api_key)
                await send.send(("canary", result, time.monotonic()))

    def _post_health(self, obs: sm.Observation | None) -> None:
        if obs is None:
            return
        if isinstance(obs, sm.HealthFailed):
            self.hint = obs.failure.cls
        self.daemon.post(obs)


def _size(path: str | None) -> int:
    if not path:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
