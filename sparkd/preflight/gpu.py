"""Check: no leftover compute process holds the GPUs this launch will use.

``nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid --format=csv,noheader`` lists them (host PIDs), and
``--query-gpu=index,uuid`` the GPUs. Only the launch's GPUs count (:mod:`sparkd.launch_devices`: its
CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or container request; all when it names none): a compute process
on another GPU is a neighbour's, not a leftover. A listed process that is stale (:mod:`sparkd.preflight.neighbours`)
is ended; any other one fails the check (``gpu_busy``: "CUDA-capable device(s) is/are busy or unavailable")
naming its PID, command line, container and owning sparkd instance. The watched instance's processes are not
leftovers. Without ``nvidia-smi`` the check is skipped with a note.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from sparkd.launch_devices import Devices, Gpu, launch_devices
from sparkd.preflight import holders, processes
from sparkd.preflight.base import CheckResult, PreflightContext, Verdict, check
from sparkd.supervisor.failures import FailureClass

QUERY = ("--query-compute-apps=pid,process_name,gpu_uuid", "--format=csv,noheader")
GPUS = ("--query-gpu=index,uuid", "--format=csv,noheader")
TIMEOUT_S = 30.0  # nvidia-smi can hang on a wedged GPU


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
    env = {**ctx.cfg.container.env, **ctx.spec.env}
    container = ctx.runtime.name != "process"
    return launch_devices(env, container=container, gpus=ctx.cfg.container.gpus if container else None)


async def _smi(smi: str, args: tuple[str, ...]) -> tuple[int, str, str]:
    with anyio.fail_after(TIMEOUT_S):
        result = await anyio.run_process([smi, *args], check=False)
    return result.returncode, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")


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


@check("gpu")
async def check_gpu(ctx: PreflightContext) -> CheckResult:
    ctx = await processes.launch_places(ctx)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return CheckResult("gpu", Verdict.ok, "skipped: nvidia-smi is not on PATH (no NVIDIA driver here)")
    try:
        code, out, err = await _smi(smi, QUERY)
        devices = devices_of(ctx)
        gpus = parse_gpus((await _smi(smi, GPUS))[1]) if code == 0 and not devices.every else []
    except TimeoutError:
        return CheckResult("gpu", Verdict.fail, f"nvidia-smi did not answer within {TIMEOUT_S:.0f} s: the GPU or "
                           "its driver is wedged (a reboot is likely needed)", failure_class=FailureClass.gpu_busy)
    except OSError as exc:
        return CheckResult("gpu", Verdict.warn, f"cannot run nvidia-smi: {exc}")
    if code != 0:
        detail = (err or out).strip().splitlines()
        return CheckResult("gpu", Verdict.warn, f"nvidia-smi exited with {code}: "
                           f"{detail[-1] if detail else 'no output'}")
    apps, elsewhere = on_launch_gpus(parse_compute_apps(out), gpus, devices)
    named, stale_pids = await _named(ctx, apps) if apps else ({}, set())
    verdict, found, end = decide(apps, stale_pids, ctx.protect, named, dry_run=ctx.dry_run, elsewhere=elsewhere)
    if verdict is Verdict.fail:
        return CheckResult("gpu", verdict, found, failure_class=FailureClass.gpu_busy)
    if verdict is Verdict.warn:
        return CheckResult("gpu", verdict, found, "would SIGTERM, wait, then SIGKILL them")
    if not end:
        return CheckResult("gpu", verdict, found)
    candidates = await anyio.to_thread.run_sync(processes.stale_candidates, ctx)
    _, survivors = await processes.end_candidates(ctx, [c for c in candidates if c.pid in end])
    if survivors:
        return CheckResult("gpu", Verdict.fail, found + "; still running after SIGKILL: "
                           + ", ".join(str(s.pid) for s in survivors), failure_class=FailureClass.gpu_busy)
    return CheckResult("gpu", verdict, found, f"ended {len(end)} process(es) with SIGTERM/SIGKILL")
