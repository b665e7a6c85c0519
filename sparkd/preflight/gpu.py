"""Check: no leftover compute process holds a GPU of this launch.

The node's GPUs are read through NVML (``nvidia-smi`` when NVML cannot be had: ``sparkd.gpu.reading``) and only
the launch's devices are looked at (``CUDA_VISIBLE_DEVICES``, the container's device request:
:mod:`sparkd.gpu.scope`); a process on another GPU belongs to someone else's launch. A listed process that is a
stale vLLM process (see :mod:`sparkd.preflight.processes`) is ended; any other one fails the check
(``gpu_busy``: "CUDA-capable device(s) is/are busy or unavailable") naming its PID and command line. The watched
instance's processes are not leftovers. Without a driver the check is skipped with a note.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
import psutil

from sparkd.gpu.model import GpuView
from sparkd.gpu.reading import scope_of
from sparkd.gpu.release import wait_released
from sparkd.gpu.scope import Scope
from sparkd.preflight import processes
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check, describe_cmdline, read_cmdline
from sparkd.supervisor.failures import FailureClass


@dataclass(frozen=True)
class App:
    pid: int
    name: str


def parse_compute_apps(text: str) -> list[App]:
    """``1234, /usr/bin/python3`` lines; "No running processes found" and blank lines give nothing."""
    apps = []
    for line in text.splitlines():
        pid, sep, name = line.partition(",")
        if sep and pid.strip().isdigit():
            apps.append(App(int(pid.strip()), name.strip()))
    return apps


def decide(apps: list[App], stale_pids: set[int], protect: frozenset[int], cmdlines: dict[int, str], *,
           dry_run: bool) -> tuple[Verdict, str, list[int]]:
    """Pure: (verdict, found, PIDs to end) for the compute processes nvidia-smi listed."""
    leftovers = [a for a in apps if a.pid not in protect]
    if not leftovers:
        note = f" ({len(apps)} belong to the watched instance)" if apps else ""
        return Verdict.ok, "no leftover GPU compute process" + note, []

    def show(a: App) -> str:
        return f"PID {a.pid} ({cmdlines.get(a.pid) or a.name})"

    others = [a for a in leftovers if a.pid not in stale_pids]
    if others:
        return (Verdict.fail, "GPU compute process(es) not started by this launch hold the GPU: "
                + "; ".join(map(show, others)) + ": not stale vLLM processes, so sparkd leaves them alone; stop "
                "them before launching", [])
    text = "stale vLLM compute process(es) hold the GPU: " + "; ".join(map(show, leftovers))
    if dry_run:
        return Verdict.warn, text, []
    return Verdict.fixed, text, [a.pid for a in leftovers]


SETTLE_S = 5.0  # how long a listed process that has ended may take to leave NVML's list (measured: 0.07-0.2 s)


def ended(pid: int) -> bool:
    """Gone, or a zombie: its GPU context is being torn down (or will be at its reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


async def settled_gpus(ctx: PreflightContext) -> GpuView:
    """The GPUs once the processes that just ended (the stale sweep's) are off NVML's list: the driver lists a
    process until it has torn its context down, 0.07-0.2 s after it exits, and a check reading in between saw
    its memory held (tests/gpu/README.md). Waited for at most SETTLE_S."""
    view = await ctx.gpus()
    gone = {p.pid for d in view.devices for p in d.processes if ended(p.pid)}
    if not view.available or not gone:
        return view
    await wait_released(ctx.gpus, gone, SETTLE_S, now=time.monotonic)
    return await ctx.gpus()


def launch_scope(ctx: PreflightContext) -> Scope:
    return scope_of(ctx.cfg, ctx.runtime.name, ctx.spec.env, ctx.image.env if ctx.image is not None else None)


def scoped_apps(view: GpuView, scope: Scope) -> list[App]:
    """The compute processes on the launch's devices, each once."""
    seen: dict[int, App] = {}
    for device in scope.pick(view.devices):
        for p in device.processes:
            seen.setdefault(p.pid, App(p.pid, f"on {device.label}"))
    return list(seen.values())


@check("gpu")
async def check_gpu(ctx: PreflightContext) -> CheckResult:
    view = await settled_gpus(ctx)
    if not view.available:
        return CheckResult("gpu", Verdict.ok, f"skipped: {view.skipped}")
    scope = launch_scope(ctx)
    apps = scoped_apps(view, scope)
    where = f" on {scope.describe()}" if scope.ids is not None else ""
    candidates = await anyio.to_thread.run_sync(processes.stale_candidates, ctx) if apps else []
    cmdlines = {a.pid: describe_cmdline(read_cmdline(ctx.proc_root, a.pid)) for a in apps}
    cmdlines = {pid: text for pid, text in cmdlines.items() if text != "?"}
    verdict, found, end = decide(apps, {c.pid for c in candidates}, ctx.protect, cmdlines, dry_run=ctx.dry_run)
    found += where
    if verdict is Verdict.fail:
        return CheckResult("gpu", verdict, found, failure_class=FailureClass.gpu_busy)
    if verdict is Verdict.warn:
        return CheckResult("gpu", verdict, found, "would SIGTERM, wait, then SIGKILL them")
    if not end:
        return CheckResult("gpu", verdict, found)
    _, survivors = await processes.end_candidates(ctx, [c for c in candidates if c.pid in end])
    if survivors:
        return CheckResult("gpu", Verdict.fail, found + "; still running after SIGKILL: "
                           + ", ".join(str(s.pid) for s in survivors), failure_class=FailureClass.gpu_busy)
    return CheckResult("gpu", verdict, found, f"ended {len(end)} process(es) with SIGTERM/SIGKILL")
