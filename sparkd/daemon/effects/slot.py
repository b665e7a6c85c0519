"""The instance this node runs now, its watch, its startup progress and the launch's timing: held by the node's
effects (:meth:`InstanceSlot.hold`, :meth:`InstanceSlot.clear`), one at a time (:attr:`InstanceSlot.busy`: a launch
and a stop never overlap), read by the guard's hooks, the evidence, the recorder, the status and the metrics."""

from __future__ import annotations

import anyio

from sparkd.daemon.loop.timing import LaunchTiming
from sparkd.daemon.watch.instance import InstanceWatch
from sparkd.runtime.base import Instance, Runtime
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.readings import VllmMetrics


class InstanceSlot:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.instance: Instance | None = None
        self.watch: InstanceWatch | None = None
        self.startup = Startup()  # its startup progress, read from its log
        self.timing: LaunchTiming | None = None  # the current (or last) launch's, for status and metrics
        self.busy = anyio.Lock()  # held by a launch and by a stop: they never overlap

    def progressed(self, startup: Startup) -> None:
        self.startup = startup

    def hold(self, instance: Instance, watch: InstanceWatch) -> None:
        self.instance, self.watch = instance, watch

    def clear(self) -> None:
        self.instance, self.watch = None, None

    def current(self) -> Instance | None:
        return self.instance

    def pids(self) -> set[int]:
        return self.runtime.pids(self.instance) if self.instance is not None else set()

    def metrics(self) -> VllmMetrics | None:
        """vLLM's last metrics scrape, while it is watched."""
        return self.watch.vllm_metrics if self.watch is not None else None
