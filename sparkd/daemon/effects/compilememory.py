"""What the last start left in vLLM's compile cache, kept in ``<state_dir>/compile-cache.json``, and what this start
may expect of it: a hit when the last start stored the same entry from the same image and launch where it outlives
the place vLLM runs in (``sparkd.supervisor.compilelog.expectation``), else what explains a miss. The expectation is
asked when an instance is watched (:class:`~sparkd.daemon.effects.output.VllmOutput` reads the verdict from its
log, and warns of a miss where a hit was expected); once the start is ready, the verdict is logged and what this
start stored is remembered for the next."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sparkd.config import Config, RuntimeKind
from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.logs import Logger
from sparkd.launch.compilecache import VLLM, unpersisted_caches
from sparkd.launch.render import effective_env
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.compilelog import CacheMemory, Verdict, expectation, remembered
from sparkd.supervisor.states import State

FILE = "compile-cache.json"


def persisted(cfg: Config) -> bool:
    """vLLM's compile cache outlives the place vLLM runs in: the host; a docker-run launch with it on a mount (a new
    container each launch); docker-exec's long-lived container (until it is recreated)."""
    if cfg.runtime is not RuntimeKind.docker_run:
        return True
    env = {name: setting.value for name, setting in effective_env(cfg).items()}
    return VLLM not in unpersisted_caches(cfg, env)


class CompileMemory:
    def __init__(self, state_dir: Path, files: StateWriter, image: Callable[[], str | None], log: Logger) -> None:
        self.path = state_dir / FILE
        self.files = files
        self.image = image  # the image id vLLM runs from (None on the host)
        self.log = log
        self.previous = self._load()

    def _load(self) -> CacheMemory | None:
        try:
            return CacheMemory.from_json(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None  # none yet, or damaged: a first start

    def expect(self, cfg: Config) -> tuple[bool, str | None]:
        """(a hit is expected, what explains a miss) for a start under ``cfg``."""
        return expectation(self.previous, launch_hash=cfg.launch_hash(), image=self.image())

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """A start became ready: its verdict logged, what it stored remembered for the next start."""
        if not (after.state is State.ready and before.state is State.starting and after.timing is not None):
            return
        timing, cfg = after.timing, after.config
        cache = timing.compile
        if cache is None or cache.verdict in (Verdict.unknown, Verdict.off) or timing.adopted:
            return
        said = timing.compile_json() or {}  # a miss where a hit was expected was a warning when it was read
        self.log.info("compile_cache", sentence=said.get("sentence"), key=cache.key)
        self.previous = remembered(cache, launch_hash=cfg.launch_hash(), image=self.image(),
                                   persisted=persisted(cfg))
        self.files.put(self.path, self.previous.to_json())
