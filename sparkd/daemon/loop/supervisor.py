"""The supervising loop: observations in, the node's state folded, actions out.

One queue, one writer of the node's state (:class:`~sparkd.daemon.loop.nodestate.NodeState`). Everything that
happens — a process exit, a log line that shows progress, a probe result, an operator command, a reload, a signal,
time — arrives through :meth:`Supervisor.post`; :meth:`apply` folds it (:func:`sparkd.daemon.loop.nodestate.fold`,
the lifecycle table inside), logs the edge taken (or that the pair was ignored), keeps what the lifecycle must
remember, tells the one ``on_state`` hook, and hands each action to the :class:`Effects` port as a task of its
own, with the state it was decided in. The loop never blocks: effects run beside it and post back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from sparkd.config import Config
from sparkd.daemon.loop.nodestate import NodeState, fold
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.supervisor import lifecycle
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.policy import window_weight
from sparkd.supervisor.states import Limits, Machine, Remembered, State, quiescent, remembered

TICK_S = 1.0  # while a state has deadlines (the startup's budget and silence): they are checked this often
QUEUE_SIZE = 10_000
SUBMIT_TIMEOUT_S = 30.0  # a command waits at most this long for the loop to take its observation


class Effects(Protocol):
    """What the lifecycle's actions do, each with the node's state the action was decided in (its config, its
    instance, its timing): their inputs, never read from shared objects. Each posts its outcome back."""

    async def preflight(self, state: NodeState) -> None:
        """Check (and clean) this node, and on a group's head every worker; post PreflightDone."""

    async def launch(self, state: NodeState) -> None:
        """Launch vLLM; post Launched or LaunchFailed."""

    async def stop(self, stop: v.Stop, state: NodeState) -> None:
        """Stop ``state.instance`` (SIGTERM, grace, SIGKILL) and sweep the node; post StopDone. ``stop.failure``:
        what the stop answers; a wedge verdict, or ``stop.hung``, shortens the grace."""

    async def record(self, record: v.RecordIncident, state: NodeState) -> None:
        """Count the failure, keep its evidence (unless ``record.written``), tell the group's head."""

    async def cut(self, cut: v.CutStop, state: NodeState) -> None:
        """The stop in progress ends its instance now, its drain cut short (``--now`` while it drains)."""
    async def accept(self, run: v.RunGate, state: NodeState) -> None:
        """Run the acceptance gate against ``state.instance``; post GateDone (never raises for what vLLM answers)."""


OnState = Callable[[NodeState, NodeState, v.Posted], None]  # (before, after, what was applied)


def in_order(*hooks: OnState) -> OnState:
    """One ``on_state`` hook that calls ``hooks`` in the order given (the composition root names them once)."""

    def on_state(before: NodeState, after: NodeState, posted: v.Posted) -> None:
        for hook in hooks:
            hook(before, after, posted)

    return on_state


class Supervisor:
    """The mailbox (:meth:`post`, :meth:`submit`) and the node state's one writer (:meth:`apply`). It is built first,
    so every part that posts to it is built complete; the effects it hands actions to and the ``on_state`` hook that
    the views hang on arrive with :meth:`run`."""

    def __init__(
        self, *, state: NodeState, clock: Clock, log: Logger,
        remember: Callable[[Remembered], None] = lambda r: None,
    ) -> None:
        self.current = state
        self.effects: Effects | None = None  # the node's, while the loop runs (actions arrive only then)
        self.on_state: OnState = lambda before, after, posted: None
        self.clock = clock
        self._log = log
        self.remember = remember
        self.alive_at = clock.now()  # the watchdog pets only while this moves
        self.booted = anyio.Event()
        self.shutting_down = False
        self._remembered = remembered(state.machine)
        self._launching = False  # a Launch effect runs and has not reported yet
        self._held: list[v.Stop] = []  # stops decided meanwhile: they need the instance the launch reports
        self._send, self._recv = anyio.create_memory_object_stream[tuple[v.Posted, anyio.Event | None]](QUEUE_SIZE)
        self._tg: TaskGroup | None = None
        self._preflight: anyio.CancelScope | None = None
        self._tick_sleep: anyio.CancelScope | None = None  # the ticker's sleep, cut short by a new deadline
        self._effects_running = 0

    def state(self) -> State:
        """The lifecycle state now (the parts that must know it read it here; only :meth:`apply` changes it)."""
        return self.current.machine.state

    def node(self) -> NodeState:
        """The node's state now: a frozen value, read by the views and the parts that act outside an effect."""
        return self.current

    def config(self) -> Config:
        """The config in force (a reload changes it in order with everything else, through the queue)."""
        return self.current.config

    def instance(self) -> Instance | None:
        return self.current.instance

    @property
    def machine(self) -> Machine:
        return self.current.machine

    @property
    def limits(self) -> Limits:
        return self.current.limits

    @property
    def log(self) -> Logger:
        return self._log.bind(state=self.current.machine.state.value)

    def post(self, obs: v.Posted, applied: anyio.Event | None = None) -> None:
        try:
            self._send.send_nowait((obs, applied))
        except anyio.WouldBlock:  # never in practice: QUEUE_SIZE observations unprocessed means a wedged loop
            self.log.error("observation_dropped", observation=type(obs).__name__)

    async def submit(self, obs: v.Posted) -> None:
        """Post ``obs`` and return once the loop has applied it (an operator's command sees its effect)."""
        applied = anyio.Event()
        self.post(obs, applied)
        with anyio.move_on_after(SUBMIT_TIMEOUT_S):
            await applied.wait()

    async def run(self, effects: Effects, boot: Callable[[], Awaitable[Instance | None]],
                  on_state: OnState | None = None) -> None:
        """Boot (adopt what runs), then apply observations until a shutdown finds nothing running; each action is
        handed to ``effects``, each new state to ``on_state``."""
        async with anyio.create_task_group() as tg:
            self._tg, self.effects = tg, effects
            self.on_state = on_state or self.on_state
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
        return quiescent(self.current.machine) and self._effects_running == 0

    def shutdown(self) -> None:
        self.shutting_down = True
        self.post(v.ShutdownRequested())

    def apply(self, obs: v.Posted) -> None:
        state = self.current
        now = self.clock.now()
        self.alive_at = now
        after, actions, edge = fold(state, obs, now)
        self.current = after
        before = state.machine
        if isinstance(obs, v.Observation):
            self._log_step(before, after.machine, obs, edge, now)
        if isinstance(obs, v.Launched | v.LaunchFailed):
            self._launching = False
        machine = after.machine
        if machine.state is not State.preflight and self._preflight is not None:
            self._preflight.cancel()
        rearm = machine.state is not before.state or (machine.deadline is not None
                                                       and machine.deadline != before.deadline)
        if rearm and self._tick_sleep is not None:
            self._tick_sleep.cancel()  # the ticker sleeps toward no deadline or an older one: re-arm it
        memory = remembered(machine)
        if memory != self._remembered:
            self._remembered = memory
            self.remember(memory)
        if after is not state:
            self.on_state(state, after, obs)
        for action in actions:
            self._act(action, after)
        if not self._launching and self._held:
            held, self._held = self._held, []
            for stop in held:  # the launch reported: its instance (or none) is in the state now
                self._spawn(stop, self.effects.stop if self.effects else None, stop, after)

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
        if after.deadline is not None:  # a backoff's wait, or the acceptance gate's budget
            name = "backoff_s" if after.state is State.backoff else "deadline_s"
            fields[name] = round(after.deadline - after.since, 1)
        if after.breaker_reason is not None:
            fields["breaker"] = after.breaker_reason
        rs = after.restart_state
        fields.update(consecutive=rs.consecutive, waits=rs.waits,
                      budget_weight=window_weight(rs, self.current.limits.restart, now))
        self._log.info("transition", state=after.state.value, **fields)

    def _act(self, action: v.Action, state: NodeState) -> None:
        """Start ``action``'s effect with the state it was decided in. A stop decided while a launch runs waits for
        the launch's report: it stops the instance the launch made (a launch and a stop never overlap)."""
        assert self.effects is not None, "actions arrive only while the loop runs"
        if isinstance(action, v.RunPreflight):
            self._spawn(action, self._run_preflight, state)
        elif isinstance(action, v.Launch):
            self._launching = True
            self._spawn(action, self.effects.launch, state)
        elif isinstance(action, v.Stop):
            if self._launching:
                self._held.append(action)
            else:
                self._spawn(action, self.effects.stop, action, state)
        elif isinstance(action, v.RecordIncident):
            self._spawn(action, self.effects.record, action, state)
        elif isinstance(action, v.CutStop):
            if self._held:  # the stop waits for a launch: it will not drain either
                self._held = [replace(stop, now=True) for stop in self._held]
            else:
                self._spawn(action, self.effects.cut, action, state)
        elif isinstance(action, v.RunGate):
            self._spawn(action, self.effects.accept, action, state)

    def _spawn(self, action: v.Action, fn: Callable[..., Awaitable[None]] | None, *args: Any) -> None:
        """Run an effect beside the loop. An effect that raises is a bug or a host problem, never the end of
        the daemon: it is logged with its traceback, and the lifecycle hears the outcome it waits for."""
        assert self._tg is not None and fn is not None, "actions arrive only while the loop runs"

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

    async def _run_preflight(self, state: NodeState) -> None:
        assert self.effects is not None
        with anyio.CancelScope() as scope:
            self._preflight = scope
            await self.effects.preflight(state)
        if self._preflight is scope:
            self._preflight = None

    def _tick_wait(self) -> float | None:
        """How long until the lifecycle needs a Tick: every TICK_S in a state the table steps on time (starting),
        up to a backoff's end; None in a state that takes none (nothing to check: the ticker sleeps until the state
        changes)."""
        m = self.current.machine
        if (m.state, v.Tick) not in lifecycle.TABLE or (m.state is State.accepting and m.deadline is None):
            return None  # accepting with no deadline: a refusal holds, nothing to check on time
        return TICK_S if m.deadline is None else min(TICK_S, m.deadline - self.clock.now())

    async def _ticker(self) -> None:
        """Time for the lifecycle's deadlines: every TICK_S while starting, and right at a backoff's end — at once
        when it is due already (a zero backoff); a new state or deadline cuts the sleep short (``apply``). A state
        with no deadline gets no Tick: at rest the loop sleeps until something happens."""
        while True:
            wait = self._tick_wait()
            if wait is None or wait > 0:
                with anyio.CancelScope() as scope:
                    self._tick_sleep = scope
                    if wait is None:
                        await anyio.sleep_forever()
                    else:
                        await self.clock.sleep(max(wait, 0.01))
                self._tick_sleep = None
                if scope.cancelled_caught or wait is None:
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
