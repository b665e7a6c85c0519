"""The supervising loop: observations in, the lifecycle table decides, actions out.

One queue, one writer of the machine. Everything that happens — a process exit, a log line that shows
progress, a probe result, an operator command, a signal, time — arrives through :meth:`Supervisor.post`;
:meth:`apply` runs it through :func:`sparkd.supervisor.lifecycle.step`, logs the edge taken (or that the pair
was ignored), keeps what the lifecycle must remember, tells the listeners, and hands each action to the
:class:`Effects` port as a task of its own. The loop never blocks: effects run beside it and post back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from sparkd.host.clock import Clock
from sparkd.supervisor import lifecycle
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.policy import window_weight
from sparkd.supervisor.states import Limits, Machine, Remembered, State, quiescent, remembered

TICK_S = 1.0  # the loop's heartbeat: deadlines are checked at least this often, and the watchdog sees it move
QUEUE_SIZE = 10_000
SUBMIT_TIMEOUT_S = 30.0  # a command waits at most this long for the loop to take its observation


class Effects(Protocol):
    """What the lifecycle's actions do; each posts its outcome back as an observation."""

    async def preflight(self) -> None:
        """Check (and clean) this node, and on a group's head every worker; post PreflightDone."""

    async def launch(self) -> None:
        """Launch vLLM; post Launched or LaunchFailed."""

    async def stop(self, reason: str, grace_s: float | None, failure: Failure | None = None,
                   hung: bool = False) -> None:
        """Stop the instance (SIGTERM, grace, SIGKILL) and sweep the node; post StopDone. ``failure``: what the
        stop answers; a wedge verdict, or ``hung``, shortens the grace."""

    async def record(self, failure: Failure, written: bool) -> None:
        """Count the failure, keep its evidence (unless ``written``), tell the group's head."""


Listener = Callable[[Machine, Machine, v.Observation], None]


class Supervisor:
    """The mailbox (:meth:`post`, :meth:`submit`) and the machine's one writer (:meth:`apply`). It is built first, so
    every part that posts to it is built complete; the effects it hands actions to arrive with :meth:`run`."""

    def __init__(
        self, *, machine: Machine, limits: Limits, clock: Clock, log: Any,
        remember: Callable[[Remembered], None] = lambda r: None,
    ) -> None:
        self.machine = machine
        self.limits = limits
        self.effects: Effects | None = None  # the node's, while the loop runs (actions arrive only then)
        self.clock = clock
        self._log = log
        self.remember = remember
        self.listeners: list[Listener] = []
        self.alive_at = clock.now()  # the watchdog pets only while this moves
        self.booted = anyio.Event()
        self.shutting_down = False
        self._remembered = remembered(machine)
        self._send, self._recv = anyio.create_memory_object_stream[tuple[v.Observation, anyio.Event | None]](
            QUEUE_SIZE)
        self._tg: TaskGroup | None = None
        self._preflight: anyio.CancelScope | None = None
        self._tick_sleep: anyio.CancelScope | None = None  # the ticker's sleep, cut short by a new deadline
        self._effects_running = 0

    def state(self) -> State:
        """The lifecycle state now (the parts that must know it read it here; only :meth:`apply` changes it)."""
        return self.machine.state

    def listen(self, listener: Listener) -> None:
        """Call ``listener(before, after, observation)`` after every change of the machine."""
        self.listeners.append(listener)

    def configure(self, limits: Limits) -> None:
        """A reloaded config's limits: the next observation is stepped with them."""
        self.limits = limits

    @property
    def log(self) -> Any:
        return self._log.bind(state=self.machine.state.value)

    def post(self, obs: v.Observation, applied: anyio.Event | None = None) -> None:
        try:
            self._send.send_nowait((obs, applied))
        except anyio.WouldBlock:  # never in practice: QUEUE_SIZE observations unprocessed means a wedged loop
            self.log.error("observation_dropped", observation=type(obs).__name__)

    async def submit(self, obs: v.Observation) -> None:
        """Post ``obs`` and return once the loop has applied it (an operator's command sees its effect)."""
        applied = anyio.Event()
        self.post(obs, applied)
        with anyio.move_on_after(SUBMIT_TIMEOUT_S):
            await applied.wait()

    async def run(self, effects: Effects, boot: Callable[[], Awaitable[bool]]) -> None:
        """Boot (adopt what runs), then apply observations until a shutdown finds nothing running; each action is
        handed to ``effects``."""
        async with anyio.create_task_group() as tg:
            self._tg, self.effects = tg, effects
            tg.start_soon(self._ticker)
            found = await boot()
            self.apply(v.Adopted(found))
            self.booted.set()
            async for obs, applied in self._recv:
                self.apply(obs)
                if applied is not None:
                    applied.set()
                if self.shutting_down and self.idle():
                    break
            tg.cancel_scope.cancel()

    @property
    def effects_running(self) -> int:
        """How many of the effects the loop started (preflight, launch, stop, record) run now."""
        return self._effects_running

    def idle(self) -> bool:
        """Nothing of vLLM's runs or is being changed: a shutting-down daemon may exit."""
        return quiescent(self.machine) and self._effects_running == 0

    def shutdown(self) -> None:
        self.shutting_down = True
        self.post(v.ShutdownRequested())

    def apply(self, obs: v.Observation) -> None:
        before = self.machine
        now = self.clock.now()
        self.alive_at = now
        after, actions, edge = lifecycle.step(before, obs, now, self.limits)
        self.machine = after
        self._log_step(before, after, obs, edge, now)
        if after.state is not State.preflight and self._preflight is not None:
            self._preflight.cancel()
        if after.deadline is not None and after.deadline != before.deadline and self._tick_sleep is not None:
            self._tick_sleep.cancel()  # the ticker sleeps toward no deadline or an older one: re-arm it
        memory = remembered(after)
        if memory != self._remembered:
            self._remembered = memory
            self.remember(memory)
        if after is not before:
            for listener in self.listeners:
                listener(before, after, obs)
        for action in actions:
            self._act(action)

    def _log_step(self, before: Machine, after: Machine, obs: v.Observation, edge: str | None, now: float) -> None:
        name = type(obs).__name__
        if edge is None:
            if not isinstance(obs, v.Tick):
                chatty = isinstance(obs, v.Progress | v.Launched | v.HealthDegraded | v.HealthRecovered)
                log = self.log.debug if chatty else self.log.info
                log("ignored", observation=name, why=lifecycle.IGNORED[(before.state, type(obs))])
            return
        if after.state is before.state:
            return
        failure = after.answering or (after.last_failure if after.state in (State.failed, State.backoff) else None)
        fields: dict[str, Any] = {"from": before.state.value, "to": after.state.value, "edge": edge,
                                  "observation": name}
        if failure is not None:
            fields.update(failure=failure.cls.value, reason=failure.sentence)
        if after.deadline is not None:
            fields["backoff_s"] = round(after.deadline - after.since, 1)
        if after.breaker_reason is not None:
            fields["breaker"] = after.breaker_reason
        rs = after.restart_state
        fields.update(consecutive=rs.consecutive, waits=rs.waits,
                      budget_weight=window_weight(rs, self.limits.restart, now))
        self._log.info("transition", state=after.state.value, **fields)

    def _act(self, action: v.Action) -> None:
        assert self.effects is not None, "actions arrive only while the loop runs"
        if isinstance(action, v.RunPreflight):
            self._spawn(action, self._run_preflight)
        elif isinstance(action, v.Launch):
            self._spawn(action, self.effects.launch)
        elif isinstance(action, v.Stop):
            self._spawn(action, self.effects.stop, action.reason, action.grace_s, action.failure, action.hung)
        elif isinstance(action, v.RecordIncident):
            self._spawn(action, self.effects.record, action.failure, action.written)

    def _spawn(self, action: v.Action, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run an effect beside the loop. An effect that raises is a bug or a host problem, never the end of
        the daemon: it is logged with its traceback, and the lifecycle hears the outcome it waits for."""
        assert self._tg is not None, "actions arrive only while the loop runs"

        async def effect() -> None:
            self._effects_running += 1
            try:
                await fn(*args)
            except Exception as exc:
                self.log.exception("effect_failed", action=type(action).__name__, error=repr(exc))
                outcome = _outcome_of_a_failed(action, exc)
                if outcome is not None:
                    self.post(outcome)
            finally:
                self._effects_running -= 1
                if self.shutting_down:
                    self.post(v.Tick())  # let the loop see that the last effect is done

        self._tg.start_soon(effect)

    async def _run_preflight(self) -> None:
        assert self.effects is not None
        with anyio.CancelScope() as scope:
            self._preflight = scope
            await self.effects.preflight()
        if self._preflight is scope:
            self._preflight = None

    async def _ticker(self) -> None:
        """Time for the lifecycle's deadlines: every TICK_S, and right at a backoff's end — at once when it is
        due already (a zero backoff); a new deadline cuts the sleep short (``apply``)."""
        while True:
            deadline = self.machine.deadline
            wait = TICK_S if deadline is None else min(TICK_S, deadline - self.clock.now())
            if wait > 0:
                with anyio.CancelScope() as scope:
                    self._tick_sleep = scope
                    await self.clock.sleep(max(wait, 0.01))
                self._tick_sleep = None
                if scope.cancelled_caught:
                    continue
            self.post(v.Tick())
            if wait <= 0:
                await self.clock.sleep(0.01)  # the due tick is queued: give the loop a moment to take it


def _outcome_of_a_failed(action: v.Action, exc: Exception) -> v.Observation | None:
    """What the lifecycle must hear when an effect raised instead of reporting."""
    failure = Failure.of(FailureClass.unknown, f"sparkd could not carry out {type(action).__name__}: {exc}; "
                         "sparkd retries with backoff — the daemon's log has the traceback.", evidence=repr(exc))
    if isinstance(action, v.RunPreflight):
        return v.PreflightDone(failure)
    if isinstance(action, v.Launch):
        return v.LaunchFailed(failure)
    if isinstance(action, v.Stop):
        return v.StopDone()
    return None
