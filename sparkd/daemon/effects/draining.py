"""One stop's drain as vLLM shows it, followed while the stop runs: vLLM's shutdown lines (handed over by
:class:`~sparkd.daemon.effects.output.VllmOutput`) and its gauges (read every second through the instance's probes)
folded into a :class:`~sparkd.supervisor.drainlog.Drain`, posted to the node's state (``Draining``: the status, the
metrics, ``sparkctl restart --wait``), and the answers the stop needs from it:

- :meth:`DrainWatch.cut_reason`: when sparkd must end the tree before the grace is out — the operator cut the drain
  short (``sparkctl stop --now``, a second SIGTERM), the stop skips the drain of a vLLM launched with one while
  requests are in flight (``StopPlan.cut``), or vLLM stranded its clients (``sparkd.supervisor.graces`` rule 5);
- :meth:`DrainWatch.requests_done`: the engine finished its requests or gave up (a group's head stops its workers
  only then: a worker stopped first turns every request in flight into an NCCL error).

The rules are the core's (``graces``, ``drainlog``); this part only reads and waits.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.supervisor import drainlog
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.drainlog import Drain, DrainState
from sparkd.supervisor.graces import StopPlan
from sparkd.supervisor.healthsignal import Probes
from sparkd.supervisor.readings import VllmMetrics

GAUGES_S = 1.0  # vLLM's gauges during a drain: the count in flight between its log lines
UNTOLD_S = 5.0  # a vLLM that logs no shutdown step by then (older than 0.24): its gauges say when it is done


class DrainWatch:
    def __init__(self, post: Callable[[v.Posted], None], clock: Clock, log: Logger) -> None:
        self.post = post
        self.clock = clock
        self.log = log
        self.drain: Drain | None = None  # the stop in progress's (None: no stop follows vLLM's drain now)
        self.cut_by: str | None = None  # the operator cut the drain short (why, in words)
        self.told = False  # vLLM logged a step of its shutdown: its log, not its gauges, says when it is done
        self._changed = anyio.Event()

    @property
    def following(self) -> bool:
        return self.drain is not None

    def begin(self, launched_drain: int) -> Drain:
        """sparkd sends SIGTERM to a vLLM launched with ``--shutdown-timeout launched_drain``."""
        self.cut_by, self.told = None, False
        self._set(drainlog.begin(self.clock.now(), launched_drain))
        assert self.drain is not None
        return self.drain

    def end(self) -> Drain | None:
        """The stop is over: nothing more is followed; the node's state forgets the drain with the stop's report."""
        drain, self.drain = self.drain, None
        self._wake()
        return drain

    def on_line(self, line: str) -> None:
        """One of vLLM's (redacted) lines, while a stop follows its drain."""
        if self.drain is not None:
            self.told = self.told or drainlog.is_drain_line(line)
            self._set(drainlog.advance(self.drain, line, self.clock.now()))

    def cut(self, why: str) -> bool:
        """End the drain now (``--now`` while it runs, a second SIGTERM); False when no stop follows one."""
        if self.drain is None:
            return False
        self.cut_by = why
        self.log.warning("drain_cut", why=why, drain=self.drain.sentence(self.clock.now()))
        self._wake()
        return True

    async def follow(self, probes: Probes | None) -> None:
        """vLLM's gauges every second while it drains (its lines come between them, or never from an old vLLM)."""
        while probes is not None and self.drain is not None and self.drain.state is DrainState.draining:
            metrics = await probes.metrics()
            if isinstance(metrics, VllmMetrics) and self.drain is not None:
                self._set(drainlog.counted(self.drain, metrics.num_requests_running, metrics.num_requests_waiting))
            await self.clock.sleep(GAUGES_S)

    async def cut_reason(self, plan: StopPlan, over: anyio.Event) -> str | None:
        """Wait until the tree must be ended before its grace is out (why, in words), or ``over`` (None)."""
        while not over.is_set():
            why = self._cut_now(plan)
            if why is not None:
                return why
            await self._next_change()
        return None

    def _cut_now(self, plan: StopPlan) -> str | None:
        d = self.drain
        if self.cut_by is not None:
            return self.cut_by
        if d is None:
            return None
        if d.state is DrainState.stranded:
            return f"vLLM {d.sentence(self.clock.now())}"
        if plan.cut and d.state is DrainState.draining and d.in_flight:
            return f"the {plan.kind.value} stop skips the drain: {d.in_flight} requests in flight"
        return None

    async def requests_done(self, plan: StopPlan, over: anyio.Event) -> None:
        """Return once the engine has finished its requests or given up (or ended, or has none to wait for): on a
        group's head the workers may be stopped then."""
        if self.drain is None or self.drain.mode != "drain" or plan.kind.value not in ("drain", "now"):
            return
        while not over.is_set():
            d, now = self.drain, self.clock.now()
            if d is None or d.requests_done or d.left_s(now) <= 0 or self.cut_by is not None:
                return
            # A gauge's 0 only where vLLM logs no shutdown step: vLLM's CPU build reads 0 while streams run
            # (tests/drainwatch.py); one that logs them says when it is done.
            untold = not self.told and now - d.started_at >= UNTOLD_S
            if untold and d.in_flight == 0:
                return
            wait = d.left_s(now) if self.told or untold else min(d.left_s(now), d.started_at + UNTOLD_S - now)
            await self._next_change(within_s=max(0.05, wait))

    def wake(self) -> None:
        """Whoever waits on the drain looks again (the stop's SIGTERM is over)."""
        self._wake()

    async def _next_change(self, within_s: float | None = None) -> None:
        """The drain changes (or the stop ends, or is cut); with ``within_s``, at most that long on the clock."""
        changed = self._changed
        if within_s is None:
            await changed.wait()
            return
        async with anyio.create_task_group() as tg:
            async def timer() -> None:
                await self.clock.sleep(within_s)
                tg.cancel_scope.cancel()

            tg.start_soon(timer)
            await changed.wait()
            tg.cancel_scope.cancel()

    def _set(self, drain: Drain | None) -> None:
        if drain is self.drain:
            return
        before, self.drain = self.drain, drain
        if drain is not None and (before is None or before.state is not drain.state):
            self.log.info("drain", state=drain.state.value, sentence=drain.sentence(self.clock.now()))
        if drain is not None and drain.mode == "drain":
            self.post(v.Draining(drain))
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
