"""What the node's state shows outside the daemon after every change that shows: ``status.json`` (written off the
loop, rendered once per burst of changes) and systemd's ``STATUS=`` line (once ``READY=1`` carried the first). A
change shows when the lifecycle moved, vLLM's startup reached another phase, the memory settle began or ended, a
reload took on a config, a stop's drain moved (its state, the count in flight), the start's log told of its
compile cache or the acceptance gate moved (a part done, a verdict); a progress line of a serving vLLM (its
throughput, every few seconds) changes nothing shown, so nothing is written."""

from __future__ import annotations

from pathlib import Path

import anyio

from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.views.status import StatusView
from sparkd.host.notify import Notifier
from sparkd.supervisor import vocabulary as v


class Publisher:
    def __init__(self, files: StateWriter, path: Path, view: StatusView, notifier: Notifier,
                 booted: anyio.Event) -> None:
        self.files = files
        self.path = path
        self.view = view
        self.notifier = notifier
        self.booted = booted  # READY=1 carries the first STATUS=

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if (after.machine is not before.machine or after.startup.phase is not before.startup.phase
                or after.settling != before.settling or after.config is not before.config
                or after.drain is not before.drain or isinstance(posted, v.CompileCacheRead)
                or after.acceptance is not before.acceptance):
            self.publish()

    def publish(self) -> None:
        self.files.put(self.path, self.view.status)  # rendered when written: once per burst of changes
        if self.booted.is_set():
            self.notifier.status(self.view.line())
