"""Check: no leftover compute process holds the GPUs this launch will use.

NVML lists them (host PIDs) and the GPUs (:mod:`sparkd.host.gpu.reading`; ``nvidia-smi``'s CSV queries where NVML
cannot be had; ``parse_compute_apps`` / ``parse_gpus`` read nvidia-smi's older one-line forms). A process that has
just ended (the stale sweep's) stays listed until the driver lets its memory go, 0.07-0.2 s after its exit
(``tests/gpu/README.md``): it is waited for, at most ``SETTLE_S``, before anything is judged. Only the launch's GPUs
count (:mod:`sparkd.launch.devices`: its
CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or container request; all when it names none): a compute process
on another GPU is a neighbour's, not a leftover. A listed process that is stale (:mod:`sparkd.preflight.neighbours`)
is ended; any other one fails the check (``gpu_busy``: "CUDA-capable device(s) is/are busy or unavailable")
naming its PID, command line, container and owning sparkd instance. The watched instance's processes are not
leftovers. Without a driver the check is skipped with a note.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import psutil

from sparkd.host.gpu.model import GpuView
from sparkd.host.gpu.reading import WEDGED, devices_of_launch
from sparkd.host.gpu.release import wait_released
from sparkd.launch.devices import Devices, Gpu
from sparkd.preflight import holders, processes
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.supervisor.failures import FailureClass

SETTLE_S = 5.0  # how long a listed process that has ended may take to leave the list (measured: 0.07-0.2 s)


@dataclass(frozen=True)
class App:
    pid: int
    name: str
    gpu: str = ""  # the GPU's UUID ("" when nvidia-smi did not say)


def parse_compute_apps(text: str) -> list[App]:
    """``1234, /usr/bin/python3, GPU-…`` lines; "No running processes found" and blank lines give nothing."""
    apps = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.append(App(int(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
    return apps


def parse_gpus(text: str) -> list[Gpu]:
    """``0, GPU-…`` lines of ``--query-gpu=index,uuid``."""
    out = []
    for line in text.splitlines():
        index, sep, uuid = line.partition(",")
        if sep and index.strip().isdigit():
            out.append(Gpu(int(index.strip()), uuid.strip()))
    return out


def on_launch_gpus(apps: list[App], gpus: list[Gpu], devices: Devices) -> tuple[list[App], int]:
    """Pure: the apps on the launch's GPUs, and how many run on other GPUs. An app whose GPU nvidia-smi did not
    name, or a GPU list it did not give, counts as on the launch's GPUs (nothing proves otherwise)."""
    if devices.every or not gpus:
        return apps, 0
    mine = {g.uuid for g in devices.select(gpus)}
    known = {g.uuid for g in gpus}
    kept = [a for a in apps if a.gpu in mine or a.gpu not in known]
    return kept, len(apps) - len(kept)


def decide(apps: list[App], stale_pids: set[int], protect: frozenset[int], cmdlines: Mapping[int, str], *,
           dry_run: bool, elsewhere: int = 0) -> tuple[Verdict, str, list[int]]:
    """Pure: (verdict, found, PIDs to end) for the compute processes nvidia-smi listed on the launch's GPUs
    (``cmdlines``: how each is named; ``elsewhere``: how many run on other GPUs, left alone)."""
    aside = f"; {elsewhere} on GPUs this launch does not use, left alone" if elsewhere else ""
    leftovers = [a for a in apps if a.pid not in protect]
    if not leftovers:
        note = f" ({len(apps)} belong to the watched instance)" if apps else ""
        return Verdict.ok, "no leftover GPU compute process" + note + aside, []

    def show(a: App) -> str:
        return cmdlines.get(a.pid) or f"PID {a.pid} ({a.name})"

    others = [a for a in leftovers if a.pid not in stale_pids]
    if others:
        return (Verdict.fail, "GPU compute process(es) not started by this launch hold its GPU: "
                + "; ".join(map(show, others)) + ": not stale vLLM processes, so sparkd leaves them alone; stop "
                "them before launching", [])
    text = "stale vLLM compute process(es) hold the GPU: " + "; ".join(map(show, leftovers)) + aside
    if dry_run:
        return Verdict.warn, text, []
    return Verdict.fixed, text, [a.pid for a in leftovers]


def devices_of(ctx: PreflightContext) -> Devices:
    return devices_of_launch(ctx.cfg, ctx.runtime.name, ctx.spec.env)


def ended(pid: int) -> bool:
    """Gone, or a zombie: its GPU context is being torn down (or will be at its reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


async def settled_gpus(ctx: PreflightContext) -> GpuView:
    """The GPUs once the processes that just ended are off the list: the driver lists a process until it has torn
    its context down, and a check reading in between saw its memory held (seen on H200: tests/gpu/README.md)."""
    view = await ctx.gpus()
    gone = {p.pid for d in view.devices for p in d.processes if ended(p.pid)}
    if not view.available or not gone:
        return view
    await wait_released(ctx.gpus, gone, SETTLE_S, now=time.monotonic)
    return await ctx.gpus()


def apps_of(view: GpuView) -> tuple[list[App], list[Gpu]]:
    """The compute processes (each once, on the first GPU that lists it) and the GPUs of a reading."""
    apps: dict[int, App] = {}
    for d in view.devices:
        for p in d.processes:
            apps.setdefault(p.pid, App(p.pid, "?", d.uuid))
    return list(apps.values()), [Gpu(d.index, d.uuid) for d in view.devices]


async def _named(ctx: PreflightContext, apps: list[App]) -> tuple[dict[int, str], set[int]]:
    """How each app is named in a sentence (PID, command line, container, owner), and which are stale."""
    judged = await anyio.to_thread.run_sync(processes.judge, ctx, [a.pid for a in apps])
    containers = {a.pid: holders.container_of(ctx.proc_root, a.pid) for a in apps}
    names = await holders.container_names(c for c in containers.values() if c)
    named = {}
    for a in apps:
        cmdline = holders.cmdline_of(ctx.proc_root, a.pid)
        named[a.pid] = holders.describe(a.pid, a.name if cmdline == "?" else cmdline, containers[a.pid],
                                        judged[a.pid].owner, names)
    return named, {pid for pid, j in judged.items() if not j.neighbour}


@check
async def check_gpu(ctx: PreflightContext) -> CheckResult:
    ctx = await processes.launch_places(ctx)
    view = await settled_gpus(ctx)
    if not view.available:
        if view.skipped is not None and view.skipped.startswith(WEDGED):
            return CheckResult(Verdict.fail, view.skipped, failure_class=FailureClass.gpu_busy)
        return CheckResult(Verdict.ok, f"skipped: {view.skipped}")
    listed, gpus = apps_of(view)
    apps, elsewhere = on_launch_gpus(listed, gpus, devices_of(ctx))
    named, stale_pids = await _named(ctx, apps) if apps else ({}, set())
    verdict, found, end = decide(apps, stale_pids, ctx.protect, named, dry_run=ctx.dry_run, elsewhere=elsewhere)
    if verdict is Verdict.fail:
        return CheckResult(verdict, found, failure_class=FailureClass.gpu_busy)
    if verdict is Verdict.warn:
        return CheckResult(verdict, found, "would SIGTERM, wait, then SIGKILL them")
    if not end:
        return CheckResult(verdict, found)
    candidates = await anyio.to_thread.run_sync(processes.stale_candidates, ctx)
    _, survivors = await processes.end_candidates(ctx, [c for c in candidates if c.pid in end])
    if survivors:
        return CheckResult(Verdict.fail, found + "; still running after SIGKILL: "
                           + ", ".join(str(s.pid) for s in survivors), failure_class=FailureClass.gpu_busy)
    return CheckResult(verdict, found, f"ended {len(end)} process(es) with SIGTERM/SIGKILL")
