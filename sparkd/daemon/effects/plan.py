"""What this node launches, as the config says now: the spec (the stand-in in vLLM's place for a rehearsal), the
preflight's context, whether the rank is headless, the proof that a record is this node's launch, and the stale
leftovers of it after a stop. Read by the node's effects and the operator's commands; it holds no state, and it
names the three the effects act on: the config now (:attr:`LaunchPlan.config`), the runtime and the instance slot."""

from __future__ import annotations

from typing import Any

from sparkd.config import Role
from sparkd.daemon.effects.slot import InstanceSlot
from sparkd.daemon.loop.current import CurrentConfig
from sparkd.launch.rehearsal import rehearsal, rehearsal_skips
from sparkd.launch.render import LaunchSpec, render
from sparkd.preflight.processes import expected_launch, launch_title_prefix, stale_candidates
from sparkd.preflight.runner import PreflightContext
from sparkd.runtime.base import Runtime


class LaunchPlan:
    def __init__(self, config: CurrentConfig, runtime: Runtime, slot: InstanceSlot, *, rehearse: bool) -> None:
        self.config = config
        self.runtime = runtime
        self.slot = slot
        self.rehearse = rehearse

    @property
    def headless(self) -> bool:
        cfg = self.config()
        return cfg.node.role is Role.worker or cfg.headless

    def spec(self) -> LaunchSpec:
        spec = render(self.config())
        return rehearsal(spec) if self.rehearse else spec

    def context(self, *, dry_run: bool = False, protect: bool = False) -> PreflightContext:
        """``protect``: the watched instance's processes are never touched (an operator's preflight, a sweep)."""
        pids = frozenset(self.slot.pids()) if protect else frozenset()
        return PreflightContext(cfg=self.config(), spec=self.spec(), runtime=self.runtime, protect=pids,
                                dry_run=dry_run, skip=rehearsal_skips() if self.rehearse else {})

    def proven(self, record: dict[str, Any]) -> bool:
        """The process ``record`` names carries this node's launch marker or runs what the config launches."""
        cfg, spec = self.config(), self.spec()
        prefix = launch_title_prefix(cfg, self.runtime.name, spec.env)
        return self.runtime.proven(record, expected_launch(cfg, spec, prefix))

    def vllm_left(self) -> list[int]:
        """PIDs of this node's vLLM processes still here after a stop: the stale ones (orphaned, or of its
        previous launch), by the one definition; a neighbour's vLLM is not this node's."""
        return [c.pid for c in stale_candidates(self.context(protect=True))]
