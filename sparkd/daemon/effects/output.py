"""vLLM's output as the node takes it: every line redacted into the host copy (``vllm.log``, `sparkctl logs`); a line
that shows startup progress advances the watched instance's :class:`~sparkd.supervisor.progress.Startup` and posts
it (``Progress(startup)``), ``BecameReady`` for a headless rank whose distributed setup is done, and ``ReplayDue``
when vLLM is woken from sleep (its answers are asked again: issue 37); a line about vLLM's compile cache advances the
start's verdict and posts it with what the last start let it expect (``CompileCacheRead``); while a stop follows
vLLM's drain, every line goes to it too (:class:`~sparkd.daemon.effects.draining.DrainWatch`). The progress is this
part's own reading of the instance's log, begun afresh for every instance; the node's state holds the last one
posted."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sparkd.config import Config
from sparkd.daemon.effects.compilememory import CompileMemory
from sparkd.daemon.effects.draining import DrainWatch
from sparkd.daemon.effects.redaction import Redaction
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger, VllmLog
from sparkd.supervisor import compilelog
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.replay import woke
from sparkd.supervisor.compilelog import CompileCache, Verdict
from sparkd.supervisor.marks import LAUNCH_LINE
from sparkd.supervisor.progress import Startup, advance, is_progress


class VllmOutput:
    def __init__(self, redaction: Redaction, vllm_log: VllmLog, post: Callable[[v.Posted], None],
                 drains: DrainWatch, compiled: CompileMemory, clock: Clock, log: Logger) -> None:
        self.redaction = redaction  # secrets never reach a log, an incident or `sparkctl logs`
        self.vllm_log = vllm_log
        self.post = post
        self.drains = drains  # a stop's drain, while one is followed
        self.compiled = compiled  # what the last start left in the compile cache
        self.clock = clock
        self.log = log
        self.startup = Startup()  # the watched instance's, as its lines tell it
        self.headless = False  # the watched instance is a headless rank: its distributed setup is its readiness
        self.compile = CompileCache()  # the watched instance's compile cache verdict, as its lines tell it
        self.expected: tuple[bool, str | None] = (False, None)  # a hit due; what explains a miss

    def begin(self, cfg: Config, *, headless: bool) -> None:
        """A new instance is watched under ``cfg``: its progress starts from nothing, its compile cache verdict too."""
        self.startup, self.headless = Startup(), headless
        self.compile, self.expected = CompileCache(), self.compiled.expect(cfg)

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
        self.drains.on_line(line)
        self._compile(line)
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

    def _compile(self, line: str) -> None:
        before = self.compile
        self.compile = cache = compilelog.advance(before, line, self.clock.now())
        if cache is before:
            return
        expected, explained = self.expected
        self.post(v.CompileCacheRead(cache, expected, explained))
        if cache.verdict is not before.verdict and cache.verdict is Verdict.miss and expected:
            self.log.warning("compile_cache_miss", sentence=cache.sentence(expected, explained), key=cache.key)
