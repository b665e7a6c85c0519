"""Check: drop the page cache before the memory check (``[preflight] drop_caches``).

``sync``, then write ``3`` to ``<proc>/sys/vm/drop_caches``; reports the bytes reclaimed from meminfo's
``Cached`` before and after. Never fails: a cache that cannot be dropped is a warning (sparkd needs root for it).
On GB10 page cache is not free memory to vLLM's startup check (:mod:`sparkd.preflight.memory`).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check, human_bytes
from sparkd.preflight.memory import droppable, read_meminfo, reclaimed


def drop_caches(proc_root: Path) -> None:
    """``sync`` then ``echo 3 > <proc>/sys/vm/drop_caches``. Raises OSError when not permitted."""
    os.sync()
    with open(proc_root / "sys" / "vm" / "drop_caches", "w", encoding="ascii") as handle:
        handle.write("3\n")


@check
async def check_page_cache(ctx: PreflightContext) -> CheckResult:
    before = read_meminfo(ctx.proc_root)
    if before is None:
        return CheckResult(Verdict.warn, f"cannot read {ctx.proc_root}/meminfo")
    cached = before.cached
    if not ctx.cfg.preflight.drop_caches:
        return CheckResult(Verdict.ok, f"page cache {human_bytes(cached)}; not dropped "
                           "([preflight] drop_caches is off)")
    if ctx.dry_run:
        return CheckResult(Verdict.warn if droppable(before) else Verdict.ok,
                           f"page cache {human_bytes(cached)} ({human_bytes(droppable(before))} droppable)",
                           "would sync and drop caches")
    try:
        await anyio.to_thread.run_sync(drop_caches, ctx.proc_root)
    except OSError as exc:
        return CheckResult(Verdict.warn, f"page cache {human_bytes(cached)}; cannot drop caches: "
                           f"{exc.strerror or exc} (sparkd needs root for this)", "nothing")
    after = read_meminfo(ctx.proc_root) or before
    got = reclaimed(before, after)
    return CheckResult(Verdict.fixed if got else Verdict.ok,
                       f"page cache {human_bytes(cached)} before, {human_bytes(after.cached)} after",
                       f"synced and dropped caches: reclaimed {got} bytes ({human_bytes(got)})")
