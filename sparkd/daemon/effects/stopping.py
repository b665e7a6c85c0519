"""Stopping this node's vLLM: the plan (``sparkd.supervisor.graces.plan_for``: a drain, ``--now``, the guard's, a
wedge's), SIGTERM, vLLM's drain followed (:class:`~sparkd.daemon.effects.draining.DrainWatch`) and cut short where
the plan or the operator says so, SIGKILL after the grace; the instance's watch closed, its record removed; then the
sweep of what it left and the check that its GPU memory came back. The instance and the config are the stop
action's (the node's state it was decided in; a stop decided during a launch waits for the launch's report); the
drain is the one vLLM was launched with (``Instance.drain_s``), whatever the config says now. What the stop
did is one :class:`~sparkd.supervisor.stopreport.StopReport`: logged, written into vLLM's log, carried by
``StopDone`` into the node's state (the status's ``last_stop``) and kept with the incident it answers."""

from __future__ import annotations

import anyio

from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import headless
from sparkd.daemon.effects.watching import Watching
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.runtime.base import ExitInfo, Runtime
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.drainlog import Drain, DrainState
from sparkd.supervisor.graces import StopPlan, plan_for
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.stopreport import StopReport


class StopEffects:
    def __init__(self, runtime: Runtime, record: InstanceRecord, output: VllmOutput, leftovers: Leftovers,
                 watching: Watching, clock: Clock, log: Logger) -> None:
        self.runtime = runtime
        self.record = record
        self.output = output
        self.drains = output.drains  # vLLM's drain, as its lines (the output's) and gauges show it
        self.leftovers = leftovers
        self.watching = watching
        self.clock = clock
        self.log = log

    async def stop(self, stop: v.Stop, state: NodeState, requests_done: anyio.Event | None = None
                   ) -> StopReport | None:
        """Stop ``state.instance`` (if one runs) and sweep the node; the report of a stop that ended an instance.
        ``requests_done`` is set once vLLM has no request left to finish (a group's head stops its workers then)."""
        instance, cfg = state.instance, state.config
        report: StopReport | None = None
        pids: set[int] = set()
        done = requests_done or anyio.Event()
        if instance is None:
            done.set()
        else:
            await self.leftovers.note_shm(instance)  # what it holds now is provably ours once it is gone
            plan = plan_for(stop, cfg, launched_drain=instance.drain_s or 0, headless=headless(cfg))
            pids, started = self.runtime.pids(instance) | {instance.pid}, self.clock.now()
            self.log.info("stopping", pid=instance.pid, reason=stop.reason, plan=plan.kind.value,
                          grace_s=plan.grace_s, grace_from=plan.source)
            info, cut = await self._end(instance, plan, instance.drain_s or 0, done)
            drain = self.drains.end()
            report = StopReport(stop.reason, plan.grace_s, plan.source, self.clock.now() - started, info.describe(),
                                info.killed, self.clock.wall(), kind=plan.kind.value, cut=cut,
                                drain=_how_it_drained(drain, self.clock.now(), cut=cut is not None,
                                                      killed=bool(info.killed)))
            self.output.note(report.log_line())
            self.log.info("stopped", pid=instance.pid, reason=stop.reason, exit=info.describe(), grace_s=plan.grace_s,
                          grace_from=plan.source, sigkilled=list(info.killed), cut=cut, drain=report.drain,
                          seconds=round(report.seconds, 3))
            await self.watching.close()
            self.record.remove()
        await self.leftovers.sweep(cfg)
        self.record.released()  # after the sweep: until then its orphans are still this instance's
        if report is not None:  # the GPU memory's release verified
            report = await self.leftovers.released(report, pids, cfg.supervisor.gpu_release_timeout_s)
        return report

    async def _end(self, instance: Instance, plan: StopPlan, drain_s: int, done: anyio.Event
                   ) -> tuple[ExitInfo, str | None]:
        """SIGTERM and the plan's grace, with vLLM's drain followed: (how it ended, why sparkd cut it short)."""
        self.drains.begin(drain_s)
        ended: list[ExitInfo] = []
        over = anyio.Event()
        async with anyio.create_task_group() as tg:
            term = anyio.CancelScope()

            async def sigterm() -> None:
                with term:
                    ended.append(await self.runtime.stop(instance, plan.grace_s))
                over.set()
                self.drains.wake()

            async def release() -> None:
                await self.drains.requests_done(plan, over)
                done.set()

            tg.start_soon(sigterm)
            tg.start_soon(release)
            tg.start_soon(self.drains.follow, self.watching.instance_probes())
            why = await self.drains.cut_reason(plan, over)
            term.cancel()
            if why is not None and not ended:
                self.log.warning("stop_cut", pid=instance.pid, why=why)
                ended.append(await self.runtime.stop(instance, 0.0))
            done.set()
            tg.cancel_scope.cancel()
        return ended[-1], why

    async def hurry(self, instance: Instance | None) -> None:
        """A second SIGTERM: end the instance now, without waiting out the grace (the stop in progress cuts its
        drain; with none in progress, the instance is killed here)."""
        if instance is None:
            return
        self.log.warning("forced_stop", pid=instance.pid)
        if not self.drains.cut("a second SIGTERM"):
            await self.runtime.stop(instance, 0.0)

    def cut(self, why: str) -> None:
        """``sparkctl stop --now`` while a stop drains: end the tree now."""
        self.drains.cut(why)


def _how_it_drained(drain: Drain | None, now: float, *, cut: bool, killed: bool) -> str | None:
    """The drain in the stop's report: vLLM's own account, or that it ended (was cut, or SIGKILLed after a grace
    shorter than its drain: a wedge's) before it gave one."""
    if drain is None or drain.mode != "drain":
        return None
    if drain.state is DrainState.draining:
        what = "the drain was cut" if cut else "sparkd SIGKILLed vLLM" if killed else "vLLM ended"
        return f"{what} {now - drain.started_at:.1f} s into its {drain.timeout_s:g} s drain"
    return drain.sentence(now)
