"""vLLM's output as the node takes it: every line redacted into the host copy (``vllm.log``, `sparkctl logs`); a line
that shows startup progress advances the slot's :class:`~sparkd.supervisor.progress.Startup`, posts ``Progress``
(and ``BecameReady`` for a headless rank whose distributed setup is done), times the phase and tells the phase
listeners (the status's history, the daemon's publishing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sparkd.daemon.effects.evidence import LAUNCH_LINE
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.host.clock import Clock
from sparkd.host.logs import VllmLog
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.progress import Startup, advance, is_progress

PhaseListener = Callable[[Startup], None]


class VllmOutput:
    def __init__(self, config: CurrentConfig, plan: LaunchPlan, vllm_log: VllmLog,
                 post: Callable[[v.Observation], None], clock: Clock, log: Any) -> None:
        self.config = config  # its redactor: secrets never reach a log, an incident or `sparkctl logs`
        self.plan = plan
        self.slot = plan.slot
        self.vllm_log = vllm_log
        self.post = post
        self.clock = clock
        self.log = log
        self._phase_listeners: list[PhaseListener] = []

    def listen(self, listener: PhaseListener) -> None:
        """Call ``listener(startup)`` at every new startup phase."""
        self._phase_listeners.append(listener)

    def launching(self, argv: Sequence[str]) -> list[str]:
        """The launch's command line, redacted, into vLLM's log before it runs (``sparkd explain`` reads it)."""
        redacted = self.config.redact.argv(argv)
        self.vllm_log.append(f"{LAUNCH_LINE}{' '.join(redacted)}")
        return redacted

    def note(self, line: str) -> None:
        """A line of sparkd's own into vLLM's log (what a stop did)."""
        self.vllm_log.append(line)

    def on_line(self, line: str, persist: bool = True) -> None:
        line = self.config.redact(line)
        self.vllm_log.append(line, persist=persist)
        if not is_progress(line):
            return
        slot, before = self.slot, self.slot.startup
        slot.progressed(advance(before, line, self.clock.now()))
        if slot.startup is before:
            return
        self.post(v.Progress())
        if self.plan.headless and slot.startup.distributed_ready and not before.distributed_ready:
            self.post(v.BecameReady())
        if slot.startup.phase is not before.phase:
            if slot.timing is not None:
                slot.timing.phase(slot.startup.phase, self.clock.now())
            self.log.info("phase", phase=slot.startup.phase.value)
            for listener in self._phase_listeners:
                listener(slot.startup)
