"""Check: memory sufficiency (enough free memory for vLLM's startup check).

On a GB10 the GPU's memory is the host's: vLLM's startup check compares ``gpu_memory_utilization x total``
against *free* memory (``cudaMemGetInfo``), and page cache is not free. The field saw "Free memory on device
(4.75/119.67 GiB)" with 110 GiB in page cache; ``sync; echo 3 > /proc/sys/vm/drop_caches`` got it back.

- ``page_cache`` (:mod:`.page_cache`, which runs first): ``sync``, then write ``3`` to
  ``<proc>/sys/vm/drop_caches`` (``[preflight] drop_caches``).
- ``memory``: on discrete GPUs, vLLM's own rule on each device of the launch and the host for what it holds
  itself (:mod:`sparkd.preflight.gpumemory`). On GB10 (unified memory: NVML reports no device memory) or with
  no GPU reading, ``MemFree`` must cover ``gpu_memory_utilization x MemTotal + [preflight] memory_margin_gib``.
  When it does not, the check fails (``free_memory_refusal``) naming the top memory holders by RSS, and when
  nothing the kernel can account for explains the gap (even freeing every process and cache would not
  reach the need: the rest is held by the driver), says a reboot is likely needed. A launch into vLLM's own
  refusal costs minutes; a launch into a memory-starved node can freeze it.

Both skip a launch of the vLLM stand-in, which loads no weights and needs no free memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from sparkd.guard.meminfo import MemInfo, MeminfoError, parse_meminfo
from sparkd.launch.script import script_facts
from sparkd.preflight import gpumemory, holders, processes
from sparkd.preflight.base import (
    GIB,
    CheckResult,
    PreflightContext,
    Verdict,
    check,
    describe_cmdline,
    human_bytes,
    read_cmdline,
    read_text,
    visible_pids,
)
from sparkd.preflight.gpu import settled_gpus
from sparkd.runtime.base import TargetUnavailable
from sparkd.supervisor.failures import FailureClass

VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
TOP_HOLDERS = 5


# ---- pure parts -----------------------------------------------------------------------------------------


def reclaimed(before: MemInfo, after: MemInfo) -> int:
    return max(0, before.cached - after.cached)


def droppable(info: MemInfo) -> int:
    """What dropping caches can give back: clean page cache, not tmpfs/shm (part of Cached, not droppable)."""
    return max(0, info.cached + info.buffers - info.shmem)


def need_bytes(total: int, utilization: float, margin: int) -> int:
    # vLLM requests ceil(total x utilization); the margin keeps the node alive beside it.
    return math.ceil(total * utilization) + margin


@dataclass(frozen=True)
class Holder:
    pid: int
    rss: int
    cmdline: str


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    found: str
    short: int = 0  # bytes missing
    reboot_likely: bool = False


def assess(info: MemInfo, utilization: float, margin: int, *, holders: Sequence[Holder] = (), may_drop: int = 0,
           cache_dropped: bool = True) -> Assessment:
    """Pure: is MemFree enough for vLLM's startup check with ``utilization``?

    ``may_drop``: bytes a pending cache drop would free (a dry run has not dropped them yet).
    ``cache_dropped``: caches were dropped (or will be); when not, the page cache is named as the way out.
    ``holders``: the top processes by RSS, named when the check fails.
    """
    total, free = info.mem_total, info.mem_free
    need = need_bytes(total, utilization, margin)
    terms = (f"{utilization:.2f} x MemTotal {human_bytes(total)} + {human_bytes(margin)} margin = "
             f"{human_bytes(need)}")
    if free >= need:
        return Assessment(Verdict.ok, f"MemFree {human_bytes(free)} covers {terms}")
    if free + may_drop >= need:
        return Assessment(Verdict.warn, f"MemFree {human_bytes(free)} covers {terms} only once the page cache "
                          f"({human_bytes(may_drop)} droppable) is dropped")
    short = need - free
    parts = [f"MemFree {human_bytes(free)} is {human_bytes(short)} short of {terms}; vLLM would refuse to start"]
    cache = droppable(info)
    if cache >= GIB:
        parts.append(f"page cache holds {human_bytes(cache)}"
                     + (" ([preflight] drop_caches is off)" if not cache_dropped else " (dropping it did not help)"))
    if holders:
        parts.append("top memory holders: " + ", ".join(
            f"PID {h.pid} {h.cmdline} ({human_bytes(h.rss)})" for h in holders))
    held = info.driver_residual
    # Freeing every process, cache and kernel structure would still leave less than the need: the gap is
    # memory nothing on the host accounts for.
    reboot = total - held < need
    if reboot:
        parts.append(f"{human_bytes(held)} is held outside any process or cache (driver memory after a crash): "
                     "a reboot is likely needed")
    elif holders:
        parts.append("stop what holds the memory or lower gpu_memory_utilization")
    return Assessment(Verdict.fail, "; ".join(parts), short=short, reboot_likely=reboot)


def top_holders(rows: list[Holder], n: int = TOP_HOLDERS) -> list[Holder]:
    return sorted((r for r in rows if r.rss > 0), key=lambda h: (-h.rss, h.pid))[:n]


def utilization_of(argv: Sequence[str]) -> float:
    """``--gpu-memory-utilization`` as vLLM will receive it (typed field or extra_args), else vLLM's default."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--gpu-memory-utilization" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--gpu-memory-utilization="):
            value = arg.split("=", 1)[1]
    try:
        return float(value) if value is not None else VLLM_DEFAULT_UTILIZATION
    except ValueError:
        return VLLM_DEFAULT_UTILIZATION


# ---- I/O --------------------------------------------------------------------------------------------------


def read_meminfo(proc_root: Path) -> MemInfo | None:
    text = read_text(proc_root / "meminfo")
    try:
        return parse_meminfo(text) if text is not None else None
    except MeminfoError:
        return None


def rss_of(proc_root: Path, pid: int) -> int:
    text = read_text(proc_root / str(pid) / "status") or ""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else 0
    return 0


def memory_holders(proc_root: Path, n: int = TOP_HOLDERS) -> list[Holder]:
    rows = [Holder(pid, rss_of(proc_root, pid), "") for pid in visible_pids(proc_root)]
    return [Holder(h.pid, h.rss, describe_cmdline(read_cmdline(proc_root, h.pid), 80)) for h in top_holders(rows, n)]


async def placed(ctx: PreflightContext, found: list[Holder]) -> list[Holder]:
    """The holders with the container each runs in and the sparkd instance whose launch it is, when it is
    another's (a neighbour: sparkd never frees its memory, the operator asks its owner)."""
    judged = await anyio.to_thread.run_sync(processes.judge, ctx, [h.pid for h in found])
    containers = {h.pid: holders.container_of(ctx.proc_root, h.pid) for h in found}
    names = await holders.container_names(c for c in containers.values() if c)
    out = []
    for h in found:
        where = holders.describe(h.pid, h.cmdline, containers[h.pid], judged[h.pid].owner, names)
        out.append(Holder(h.pid, h.rss, where.removeprefix(f"PID {h.pid} ")))
    return out


async def _utilization(ctx: PreflightContext) -> float:
    """The launch's utilisation; with ``[launch] script``, the script's own flag (read where vLLM runs), else the
    cautious default."""
    script = ctx.cfg.launch.script
    if not script:
        return utilization_of(ctx.spec.argv)
    try:
        text = await ctx.runtime.read_file(script)
    except (TargetUnavailable, OSError):
        text = None
    said = script_facts(text, ctx.cfg.launch.extra_args).literal_float("--gpu-memory-utilization") if text else None
    return said if said is not None else VLLM_DEFAULT_UTILIZATION


@check
async def check_memory(ctx: PreflightContext) -> CheckResult:
    info = read_meminfo(ctx.proc_root)
    if info is None:
        return CheckResult(Verdict.warn, f"cannot read {ctx.proc_root}/meminfo")
    pf = ctx.cfg.preflight
    utilization = await _utilization(ctx)
    devices = gpumemory.launch_devices(ctx, await settled_gpus(ctx))
    if devices:
        return gpumemory.check_discrete(ctx, devices, info, utilization)
    margin = int(pf.memory_margin_gib * GIB)
    pending = pf.drop_caches and ctx.dry_run and "page_cache" not in pf.skip and "page_cache" not in ctx.skip
    first = assess(info, utilization, margin, may_drop=droppable(info) if pending else 0,
                   cache_dropped=pf.drop_caches)
    if first.verdict is not Verdict.fail:
        return CheckResult(first.verdict, first.found)
    holders = await placed(ctx, await anyio.to_thread.run_sync(memory_holders, ctx.proc_root))
    full = assess(info, utilization, margin, holders=holders, may_drop=droppable(info) if pending else 0,
                  cache_dropped=pf.drop_caches)
    return CheckResult(Verdict.fail, full.found, failure_class=FailureClass.free_memory_refusal)
