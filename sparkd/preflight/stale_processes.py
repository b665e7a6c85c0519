"""Check: no stale vLLM process is left (orphaned ``VLLM::*`` of the launch's user, or a process of this node's
previous launch): SIGTERM, ``[preflight] kill_grace_s``, SIGKILL; one that outlives SIGKILL fails the launch
(``gpu_busy``). What is stale is decided in :mod:`.processes` and :mod:`.stale`."""

from __future__ import annotations

import anyio

from sparkd.preflight import stale
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.processes import end_candidates, launch_places, stale_candidates, verdict
from sparkd.supervisor.failures import FailureClass


@check
async def check_stale_processes(ctx: PreflightContext) -> CheckResult:
    ctx = await launch_places(ctx)
    found = await anyio.to_thread.run_sync(stale_candidates, ctx)
    survivors: list[stale.StaleProcess] = []
    if found and not ctx.dry_run:
        _, survivors = await end_candidates(ctx, found)
    v, text, did = verdict(found, survivors, dry_run=ctx.dry_run)
    return CheckResult(v, text, did,
                       failure_class=FailureClass.gpu_busy if v is Verdict.fail else None)
