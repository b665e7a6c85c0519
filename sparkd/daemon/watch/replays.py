"""When vLLM's answers are asked again while it serves (issue 37): at ``[acceptance] replay_interval_s`` after the last
gate, once the engine has been idle for ``replay_idle_s`` — never beside a user's request. A sense: it only posts
``ReplayDue``; the lifecycle decides, the gate's effect asks (:mod:`sparkd.daemon.effects.accepting`). The decision
is pure (:mod:`sparkd.supervisor.acceptance.replay`).

At rest it sleeps until the interval after the last gate is over, or until the node's state changes (its
``on_state``: vLLM serves, a gate ran, a reload); only then does it look at the engine, at the health probes'
cadence: the requests the last metrics scrape saw running or waiting, and other clients' connections open on vLLM's
port (as the watch last counted them: at rest, every 30 s, ``health.clients_due``).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.clock import Clock
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.replay import Idle, due, observe_load
from sparkd.supervisor.health import HealthTracker
from sparkd.supervisor.readings import VllmMetrics
from sparkd.supervisor.states import SERVING

OFF_LOOK_S = 3600.0  # replays off, or vLLM not serving: a change of the node's state wakes it before that


class ReplayTimer:
    def __init__(self, node: Callable[[], NodeState], metrics: Callable[[], VllmMetrics | None],
                 health: Callable[[], HealthTracker | None], post: Callable[[v.Observation], None],
                 clock: Clock) -> None:
        self.node = node  # the loop's: the config in force, the state, when the last gate ran
        self.metrics = metrics  # the watch's last scrape of vLLM's /metrics
        self.health = health  # the watch's tracker: other clients' connections on vLLM's port
        self.post = post
        self.clock = clock
        self._news = anyio.Event()

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """The node changed (its state, a gate's run, the config): look again."""
        if (after.state, after.acceptance, after.config) != (before.state, before.acceptance, before.config):
            self._news.set()

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds`` on the clock, or until the node changes."""
        news = self._news = anyio.Event()
        async with anyio.create_task_group() as tg:
            async def alarm() -> None:
                await self.clock.sleep(seconds)
                tg.cancel_scope.cancel()

            async def woken() -> None:
                await news.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(alarm)
            tg.start_soon(woken)

    def _last_run(self, node: NodeState) -> float:
        runs = node.acceptance.history
        return max(runs[-1].finished_at if runs else node.machine.since, node.machine.since)

    def _wait(self) -> float:
        """Seconds until a replay could be due; 0: look at the engine now."""
        node = self.node()
        cfg = node.config.acceptance
        if not cfg.enabled or cfg.replay_interval_s <= 0 or node.state not in SERVING:
            return OFF_LOOK_S
        return max(0.0, self._last_run(node) + cfg.replay_interval_s - self.clock.now())

    async def run(self) -> None:
        idle = Idle()
        while True:
            wait = self._wait()
            if wait > 0:
                idle = Idle()
                await self._nap(wait)
                continue
            node = self.node()
            metrics, health = self.metrics(), self.health()
            clients = health.clients if health is not None else None
            running = None if metrics is None else metrics.num_requests_running + (clients or 0)
            now = self.clock.now()
            idle = observe_load(idle, running, None if metrics is None else metrics.num_requests_waiting, now)
            cfg = node.config.acceptance
            why = due(Idle(self._last_run(node), idle.idle_since), now, interval_s=cfg.replay_interval_s,
                      idle_s=cfg.replay_idle_s)
            if why is not None:
                self.post(v.ReplayDue(why))
                idle = Idle()
                await self._nap(max(cfg.replay_idle_s, 1.0))  # the gate's GateDone moves the last run
                continue
            await self.clock.sleep(node.config.health.interval_s)
