"""Stopping this node's vLLM: SIGTERM, the grace (the drain's, a wedge's shorter one, or the caller's), SIGKILL;
the instance's watch closed, its record removed; then the sweep of what it left and the check that its GPU memory
came back. The instance and the config are the stop action's (the node's state it was decided in; a stop decided
during a launch waits for the launch's report). What the stop did is one
:class:`~sparkd.supervisor.stopreport.StopReport`: logged, written into vLLM's log, carried by ``StopDone`` into
the node's state (the status's ``last_stop``) and kept with the incident it answers."""

from __future__ import annotations

from sparkd.daemon.effects.instancerecord import InstanceRecord
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.output import VllmOutput
from sparkd.daemon.effects.watching import Watching
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.runtime.base import Runtime
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.stopreport import StopReport, grace_for


class StopEffects:
    def __init__(self, runtime: Runtime, record: InstanceRecord, output: VllmOutput, leftovers: Leftovers,
                 watching: Watching, clock: Clock, log: Logger) -> None:
        self.runtime = runtime
        self.record = record
        self.output = output
        self.leftovers = leftovers
        self.watching = watching
        self.clock = clock
        self.log = log

    async def stop(self, stop: v.Stop, state: NodeState) -> StopReport | None:
        """Stop ``state.instance`` (if one runs) and sweep the node; the report of a stop that ended an instance."""
        instance, cfg = state.instance, state.config
        report: StopReport | None = None
        pids: set[int] = set()
        if instance is not None:
            await self.leftovers.note_shm(instance)  # what it holds now is provably ours once it is gone
            sup = cfg.supervisor
            grace, grace_from = grace_for(stop.grace_s, stop.failure, drain_s=sup.stop_grace_s,
                                          hung_s=sup.hung_stop_grace_s, hung=stop.hung)
            pids, started = self.runtime.pids(instance) | {instance.pid}, self.clock.now()
            info = await self.runtime.stop(instance, grace)
            report = StopReport(stop.reason, grace, grace_from, self.clock.now() - started, info.describe(),
                                info.killed, self.clock.wall())
            self.output.note(report.log_line())
            self.log.info("stopped", pid=instance.pid, reason=stop.reason, exit=info.describe(), grace_s=grace,
                          grace_from=grace_from, sigkilled=list(info.killed), seconds=round(report.seconds, 3))
            await self.watching.close()
            self.record.remove()
        await self.leftovers.sweep(cfg)
        self.record.released()  # after the sweep: until then its orphans are still this instance's
        if report is not None:  # the GPU memory's release verified
            report = await self.leftovers.released(report, pids, cfg.supervisor.gpu_release_timeout_s)
        return report

    async def hurry(self, instance: Instance | None) -> None:
        """A second SIGTERM: end the instance now, without waiting out the grace."""
        if instance is not None:
            self.log.warning("forced_stop", pid=instance.pid)
            await self.runtime.stop(instance, 0.0)
