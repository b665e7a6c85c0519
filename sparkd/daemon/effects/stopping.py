"""Stopping this node's vLLM: SIGTERM, the grace (the drain's, a wedge's shorter one, or the caller's), SIGKILL;
the instance's watch closed, its record removed; then the sweep of what it left and the check that its GPU memory
came back. What the stop did is one :class:`~sparkd.daemon.effects.stopreport.StopReport`: logged, written into vLLM's
log, shown in the status and kept with the incident it answers."""

from __future__ import annotations

from typing import Any

from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.effects.stopreport import StopReport, grace_for
from sparkd.host.clock import Clock
from sparkd.supervisor.failures import Failure


class StopEffects:
    def __init__(self, plan: LaunchPlan, record: InstanceRecord, output: VllmOutput, leftovers: Leftovers,
                 clock: Clock, log: Any) -> None:
        self.plan = plan
        self.slot = plan.slot
        self.runtime = plan.runtime
        self.record = record
        self.output = output
        self.leftovers = leftovers
        self.clock = clock
        self.log = log
        self.last: StopReport | None = None  # the last stop's, for the status

    async def stop(self, reason: str, grace_s: float | None, failure: Failure | None = None,
                   hung: bool = False) -> StopReport | None:
        """Stop the instance (if one runs) and sweep the node; the report of a stop that ended an instance."""
        async with self.slot.busy:
            instance, watch = self.slot.instance, self.slot.watch
            report: StopReport | None = None
            pids: set[int] = set()
            if instance is not None:
                await self.leftovers.note_shm()  # what it holds now is provably ours once it is gone
                sup = self.plan.config().supervisor
                grace, grace_from = grace_for(grace_s, failure, drain_s=sup.stop_grace_s, hung_s=sup.hung_stop_grace_s,
                                              hung=hung)
                pids, started = self.slot.pids() | {instance.pid}, self.clock.now()
                info = await self.runtime.stop(instance, grace)
                report = StopReport(reason, grace, grace_from, self.clock.now() - started, info.describe(),
                                    info.killed, self.clock.wall())
                self.output.note(report.log_line())
                self.log.info("stopped", pid=instance.pid, reason=reason, exit=info.describe(), grace_s=grace,
                              grace_from=grace_from, sigkilled=list(info.killed), seconds=round(report.seconds, 3))
                if watch is not None:
                    await watch.close()
                self.slot.clear()
                self.record.remove()
            await self.leftovers.sweep()
            if self.slot.instance is None:
                self.record.released()  # after the sweep: until then its orphans are still this instance's
            if report is not None:  # the GPU memory's release verified, the report kept
                report = self.last = await self.leftovers.released(report, pids)
            return report

    async def hurry(self) -> None:
        """A second SIGTERM: end the instance now, without waiting out the grace."""
        instance = self.slot.instance
        if instance is not None:
            self.log.warning("forced_stop", pid=instance.pid)
            await self.runtime.stop(instance, 0.0)
