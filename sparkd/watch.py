"""Watching one instance: its log lines, its exit (event-driven), and its HTTP health.

An :class:`InstanceWatch` lives from launch (or adoption) until the instance is stopped. It only observes
and posts observations to the daemon's queue; it never decides.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import anyio

from sparkd import probes
from sparkd.runtime.base import Instance
from sparkd.supervisor import health
from sparkd.supervisor import machine as sm
from sparkd.supervisor.classify import FailureClass
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
        failure = self.daemon.classify_exit(info.exit_code, info.signal, self.hint)
        self.daemon.log.info("exited", pid=self.instance.pid, exit=info.describe(), failure=failure.cls.value)
        self.daemon.post(sm.Exited(failure))

    async def _probe(self) -> None:
        cfg = self.daemon.cfg
        base = probes.base_url(cfg.launch.host, cfg.launch.port)
        hc = cfg.health
        async with probes.make_client() as client:
            while self.daemon.machine.state not in sm.SERVING:
                if self.daemon.machine.state is sm.State.starting:
                    result = await probes.probe_health(client, base, hc.timeout_s)
                    if result.ok:
                        self.daemon.post(sm.BecameReady())
                        break
                await anyio.sleep(READY_POLL_S)
            await self._serve_probes(client, base)

    async def _serve_probes(self, client: probes.httpx.AsyncClient, base: str) -> None:
        hc = self.daemon.cfg.health
        tracker = health.HealthTracker()
        next_canary = time.monotonic() + hc.canary_interval_s
        while True:
            await anyio.sleep(hc.interval_s)
            now = time.monotonic()
            result = await probes.probe_health(client, base, hc.timeout_s)
            tracker, obs = health.observe_health(tracker, result, now, hc)
            self._post_health(obs)
            metrics = await probes.scrape_vllm_metrics(client, base, hc.timeout_s)
            tracker, obs = health.observe_metrics(tracker, metrics, time.monotonic(), hc)
            self._post_health(obs)
            if hc.canary and time.monotonic() >= next_canary:
                canary = await probes.probe_canary(client, base, self.daemon.cfg.served_name, hc.canary_timeout_s)
                tracker, obs = health.observe_canary(tracker, canary, time.monotonic(), hc)
                self._post_health(obs)
                next_canary = time.monotonic() + hc.canary_interval_s
            self.daemon.health = tracker

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
