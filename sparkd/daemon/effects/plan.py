"""What this node launches under a given config: the spec (the stand-in in vLLM's place for a rehearsal), the
preflight's context, whether the rank is headless, the proof that a record is this node's launch, and the stale
leftovers of it after a stop. Stateless: every question names the config it is asked under (the action's, or
the one in force for an operator's question), so no answer comes from an old one."""

from __future__ import annotations

from typing import Any

from sparkd.config import Config, Role
from sparkd.launch.rehearsal import rehearsal, rehearsal_skips
from sparkd.launch.render import LaunchSpec, render
from sparkd.preflight.processes import expected_launch, launch_title_prefix, stale_candidates
from sparkd.preflight.runner import PreflightContext
from sparkd.runtime.base import Runtime


def headless(cfg: Config) -> bool:
    """This node's rank serves no HTTP: a worker of a group, or a head told so."""
    return cfg.node.role is Role.worker or cfg.headless


class LaunchPlan:
    def __init__(self, runtime: Runtime, *, rehearse: bool) -> None:
        self.runtime = runtime
        self.rehearse = rehearse

    def spec(self, cfg: Config) -> LaunchSpec:
        spec = render(cfg)
        return rehearsal(spec) if self.rehearse else spec

    def context(self, cfg: Config, *, dry_run: bool = False, protect: frozenset[int] = frozenset()) -> PreflightContext:
        """``protect``: processes never touched (the watched instance's, for an operator's preflight)."""
        return PreflightContext(cfg=cfg, spec=self.spec(cfg), runtime=self.runtime, protect=protect,
                                dry_run=dry_run, skip=rehearsal_skips() if self.rehearse else {})

    def proven(self, record: dict[str, Any], cfg: Config) -> bool:
        """The process ``record`` names carries this node's launch marker or runs what the config launches."""
        spec = self.spec(cfg)
        prefix = launch_title_prefix(cfg, self.runtime.name, spec.env)
        return self.runtime.proven(record, expected_launch(cfg, spec, prefix))

    def vllm_left(self, cfg: Config, protect: frozenset[int] = frozenset()) -> list[int]:
        """PIDs of this node's vLLM processes still here after a stop: the stale ones (orphaned, or of its
        previous launch), by the one definition; a neighbour's vLLM is not this node's."""
        return [c.pid for c in stale_candidates(self.context(cfg, protect=protect))]
