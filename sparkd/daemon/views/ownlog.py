"""sparkd's own log as the node's state changes: its level and format, and the redactor every event passes
through, follow the config in force (a reload may bring new secrets); a start's timing is logged once it is ready
(``start_timing``)."""

from __future__ import annotations

from sparkd.daemon.effects.redaction import Redaction
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.logs import Logger, configure_logging
from sparkd.launch.redact import use_for_logs
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import came_up


class OwnLog:
    def __init__(self, redaction: Redaction, log: Logger) -> None:
        self.redaction = redaction
        self.log = log

    def follow(self, state: NodeState) -> None:
        """The log's settings and redactor for ``state``'s config (at the start, and at every reload)."""
        configure_logging(state.config.log)
        use_for_logs(self.redaction.of(state.config))  # secrets never reach a log

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if after.config is not before.config:
            self.follow(after)
        was, now = before.machine, after.machine
        if came_up(was.state, now.state) and after.timing is not None:
            self.log.info("start_timing", **after.timing.to_json())
