"""vLLM's output as the node takes it: every line redacted into the host copy (``vllm.log``, `sparkctl logs`); a line
that shows startup progress advances the watched instance's :class:`~sparkd.supervisor.progress.Startup` and posts
it (``Progress(startup)``), ``BecameReady`` for a headless rank whose distributed setup is done, and ``ReplayDue``
when vLLM is woken from sleep (its answers are asked again: issue 37). The progress
is this part's own reading of the instance's log, begun afresh for every instance; the node's state holds the
last one posted."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sparkd.config import Config
from sparkd.daemon.effects.redaction import Redaction
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger, VllmLog
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.replay import woke
from sparkd.supervisor.marks import LAUNCH_LINE
from sparkd.supervisor.progress import Startup, advance, is_progress


class VllmOutput:
    def __init__(self, redaction: Redaction, vllm_log: VllmLog, post: Callable[[v.Observation], None],
                 clock: Clock, log: Logger) -> None:
        self.redaction = redaction  # secrets never reach a log, an incident or `sparkctl logs`
        self.vllm_log = vllm_log
        self.post = post
        self.clock = clock
        self.log = log
        self.startup = Startup()  # the watched instance's, as its lines tell it
        self.headless = False  # the watched instance is a headless rank: its distributed setup is its readiness

    def begin(self, *, headless: bool) -> None:
        """A new instance is watched: its progress starts from nothing."""
        self.startup, self.headless = Startup(), headless

    def launching(self, argv: Sequence[str], cfg: Config) -> list[str]:
        """The launch's command line, redacted, into vLLM's log before it runs (``sparkd explain`` reads it)."""
        redacted = self.redaction.of(cfg).argv(argv)
        self.vllm_log.append(f"{LAUNCH_LINE}{' '.join(redacted)}")
        return redacted

    def note(self, line: str) -> None:
        """A line of sparkd's own into vLLM's log (what a stop did)."""
        self.vllm_log.append(line)

    def on_line(self, line: str, persist: bool = True) -> None:
        line = self.redaction()(line)
        self.vllm_log.append(line, persist=persist)
        if persist and woke(line):
            self.post(v.ReplayDue("vLLM woke from sleep", wake=True))
        if not is_progress(line):
            return
        before = self.startup
        self.startup = startup = advance(before, line, self.clock.now())
        if startup is before:
            return
        self.post(v.Progress(startup))
        if self.headless and startup.distributed_ready and not before.distributed_ready:
            self.post(v.BecameReady())
        if startup.phase is not before.phase:
            self.log.info("phase", phase=startup.phase.value)
