"""Check: no leaked shared-memory segment in /dev/shm, and room for vLLM's rings (``[preflight]
shm_min_free_mib``); the sweep, the ledger and what counts as leaked are :mod:`.shm`'s."""

from __future__ import annotations

import anyio

from sparkd.preflight.base import MIB, CheckResult, PreflightContext, Verdict, check
from sparkd.preflight.shm import (
    IncompleteView,
    free_bytes,
    largest,
    launch_uids,
    sweep,
    verdict,
)
from sparkd.preflight.shmholders import LEDGER_NAME, ShmLedger
from sparkd.supervisor.failures import FailureClass


@check
async def check_shm(ctx: PreflightContext) -> CheckResult:
    cfg = ctx.cfg
    if not ctx.runtime.shares_host_ipc:
        return CheckResult(Verdict.ok, f"container {cfg.container.name} has its own /dev/shm "
                           "(no --ipc=host): the host's is not vLLM's")
    ledger = cfg.paths.state_dir / LEDGER_NAME
    if ctx.protect and not ctx.dry_run:  # the watched instance's segments: ours, once it is gone
        await anyio.to_thread.run_sync(lambda: ShmLedger(ledger).note(ctx.protect, ctx.shm_dir, ctx.proc_root))
    uids = launch_uids(cfg)
    try:
        removed = await anyio.to_thread.run_sync(
            lambda: sweep(ctx.shm_dir, dry_run=ctx.dry_run, proc=ctx.proc_root, ledger=ledger, uids=uids))
    except IncompleteView as exc:
        return CheckResult(Verdict.warn, str(exc))
    v, found, did = verdict(removed, free_bytes(ctx.shm_dir), cfg.preflight.shm_min_free_mib * MIB,
                            dry_run=ctx.dry_run, where=ctx.shm_dir)
    if v is Verdict.fail:
        found += await largest(ctx)
    return CheckResult(v, found, did, failure_class=FailureClass.unknown if v is Verdict.fail else None)
