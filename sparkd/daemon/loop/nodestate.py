"""The node's state: one frozen value the loop owns, and the pure fold that makes the next one.

:class:`NodeState` is everything about this node that changes: the lifecycle's machine, the config in force (and
the limits derived from it), the instance vLLM runs as, its startup progress, the launch's timing, the last stop's
report, a phase the preflight runs before its checks, the acceptance gate's standing. :func:`fold` takes one posted
value — an observation, which the lifecycle table steps (:func:`sparkd.supervisor.lifecycle.step`), or a fact of the
node's — and returns the next state with the actions to carry out. The values ride on the observations
(``Launched(instance, timing)``, ``Adopted(instance)``, ``Progress(startup)``, ``StopDone(report)``,
``GateDone(result)``, ``ConfigReplaced(cfg)``, ``GateProgress(progress)``): nothing reaches the state beside the
queue, so no part can hold an old config or an instance the loop has not heard of.

No clock, no I/O: ``now`` is passed in. The loop (:mod:`sparkd.daemon.loop.supervisor`) is its one caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from sparkd.cluster.ranks import group_role
from sparkd.config import Config, Role
from sparkd.supervisor import lifecycle
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.standing import GateKind, Standing
from sparkd.supervisor.drainlog import Drain
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.policy import RestartPolicy
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.states import Limits, Machine, State, came_up
from sparkd.supervisor.stopreport import StopReport
from sparkd.supervisor.timing import LaunchTiming

__all__ = ["NodeState", "Step", "fold", "limits_from"]


def limits_from(cfg: Config) -> Limits:
    """The lifecycle's limits as the config sets them (the restart policy, the startup budget, a led rank)."""
    r = cfg.restart
    return Limits(
        startup_timeout_s=cfg.supervisor.startup_timeout_s,
        startup_silence_s=cfg.supervisor.startup_silence_s,
        startup_extension_s=cfg.supervisor.startup_extension_s,
        restart=RestartPolicy(
            backoff_initial_s=r.backoff_initial_s, backoff_factor=r.backoff_factor,
            backoff_max_s=max(r.backoff_max_s, r.backoff_initial_s), jitter=min(r.jitter, 0.99),
            stable_after_s=r.stable_after_s, budget_failures=r.budget_failures,
            budget_window_s=r.budget_window_s, guard_kill_weight=r.guard_kill_weight,
            consecutive_limit=r.consecutive_limit or None,
        ),
        led=(led := group_role(cfg) is Role.worker),
        accept_s=_gate_budget(cfg) if cfg.acceptance.enabled and not led else None,
    )


def _gate_budget(cfg: Config) -> float:
    """The acceptance gate's budget, with a margin for the scrape before its parts and the golden's write (the gate
    ends itself within it; the lifecycle's deadline is the net)."""
    return cfg.acceptance.timeout_s + cfg.acceptance.request_timeout_s + 30.0


@dataclass(frozen=True)
class NodeState:
    machine: Machine
    config: Config  # in force: what every part reads when it acts
    limits: Limits  # derived from ``config``, with it
    instance: Instance | None = None  # what vLLM runs as now (launched or adopted), until its stop is done
    startup: Startup = field(default_factory=Startup)  # the instance's startup progress, read from its log
    timing: LaunchTiming | None = None  # the current (or last) launch's
    last_stop: StopReport | None = None  # what the last stop of an instance did
    settling: str | None = None  # a phase the start's preflight runs before its checks (memory_settle)
    drain: Drain | None = None  # the stop in progress drains vLLM's requests in flight (None: no drain now)
    acceptance: Standing = field(default_factory=Standing)  # the acceptance gate: its run, its verdict, its history

    @classmethod
    def boot(cls, machine: Machine, cfg: Config) -> NodeState:
        return cls(machine=machine, config=cfg, limits=limits_from(cfg))

    @property
    def state(self) -> State:
        return self.machine.state


class Step(NamedTuple):
    state: NodeState
    actions: list[v.Action]
    edge: str | None  # the lifecycle's edge taken; None: the lifecycle ignored it (or it was a node fact)


def fold(s: NodeState, posted: v.Posted, now: float) -> Step:
    """The next state, the actions to carry out and the lifecycle's edge, for ``posted`` at monotonic ``now``."""
    if isinstance(posted, v.ConfigReplaced):
        return Step(replace(s, config=posted.cfg, limits=limits_from(posted.cfg)), [], None)
    if isinstance(posted, v.Settling):
        return Step(s if s.settling == posted.phase else replace(s, settling=posted.phase), [], None)
    if isinstance(posted, v.Draining):
        return Step(s if s.drain is posted.drain else replace(s, drain=posted.drain), [], None)
    if isinstance(posted, v.CompileCacheRead):
        timing = s.timing.compiled(posted.cache, posted.expected, posted.explained) if s.timing else None
        return Step(replace(s, timing=timing) if timing is not None else s, [], None)
    if isinstance(posted, v.GateProgress):
        return Step(replace(s, acceptance=s.acceptance.progressed(posted.progress, GateKind(posted.kind))), [], None)
    machine, actions, edge = lifecycle.step(s.machine, posted, now, s.limits)
    after = _carried(s if machine is s.machine else replace(s, machine=machine), posted, now)
    if isinstance(posted, v.GateDone) and edge is not None:
        after = replace(after, acceptance=after.acceptance.took(posted.result, GateKind(posted.kind)))
    timing = after.timing
    if timing is not None and machine.state is State.accepting and s.machine.state is not State.accepting:
        after = replace(after, timing=timing.accepting(machine.since))
    elif timing is not None and came_up(s.machine.state, machine.state):
        after = replace(after, timing=timing.ready(machine.since))  # the launch's timing is complete
    return Step(after, actions, edge)


def _carried(s: NodeState, obs: v.Observation, now: float) -> NodeState:
    """``s`` with the values ``obs`` carries."""
    if isinstance(obs, v.Adopted) and obs.instance is not None:
        return replace(s, instance=obs.instance, startup=Startup(),
                       timing=LaunchTiming(requested_at=now, adopted=True))
    if isinstance(obs, v.PreflightDone) and obs.timing is not None:
        return replace(s, timing=obs.timing)
    if isinstance(obs, v.Launched):
        return replace(s, instance=obs.instance, startup=Startup(), timing=obs.timing,
                       acceptance=s.acceptance.new_instance())
    if isinstance(obs, v.Progress) and s.instance is not None and obs.startup != s.startup:
        timing = s.timing
        if timing is not None and obs.startup.phase is not s.startup.phase:
            timing = timing.phase(obs.startup.phase, now)
        return replace(s, startup=obs.startup, timing=timing)
    if isinstance(obs, v.StopDone):
        return replace(s, instance=None, last_stop=obs.report or s.last_stop, drain=None,
                       acceptance=s.acceptance.new_instance())
    return s
