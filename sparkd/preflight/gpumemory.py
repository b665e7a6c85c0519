"""The memory check on a node of discrete GPUs: vLLM's own rule on each device of the launch, and the host for
what it holds itself (:mod:`sparkd.host.gpu.memcheck` decides; this module reads). GB10's unified memory, or no GPU
reading, stays with the host check of :mod:`sparkd.preflight.memory`.

The watched instance's own GPU memory counts as free to an operator's preflight: it is released by the stop
that comes before any launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sparkd.guard.meminfo import MemInfo
from sparkd.host.gpu.memcheck import check_device, check_host, discrete, host_need
from sparkd.host.gpu.model import GpuDevice, GpuView
from sparkd.host.gpu.reading import pick
from sparkd.preflight.base import GIB, CheckResult, PreflightContext, Verdict, describe_cmdline, read_cmdline
from sparkd.preflight.gpu import devices_of
from sparkd.supervisor.failures import FailureClass


def launch_devices(ctx: PreflightContext, view: GpuView) -> list[GpuDevice]:
    """The launch's devices whose memory NVML reports (none on GB10, none without a reading)."""
    return discrete(pick(devices_of(ctx), view.devices)) if view.available else []


def without(device: GpuDevice, pids: frozenset[int]) -> GpuDevice:
    """``device`` as it will be once ``pids`` (the watched instance) are stopped."""
    ours = [p for p in device.processes if p.pid in pids]
    if not ours or device.free_bytes is None:
        return device
    back = sum(p.used_bytes or 0 for p in ours)
    return replace(device, free_bytes=device.free_bytes + back,
                   processes=tuple(p for p in device.processes if p.pid not in pids))


def assess(devices: Sequence[GpuDevice], utilization: float, cmdlines: dict[int, str], info: MemInfo,
           argv: Sequence[str], margin: int) -> tuple[Verdict, str]:
    """Pure: every device against vLLM's rule, then the host's own need."""
    checks = [check_device(d, utilization, cmdlines) for d in devices]
    host_ok, host_text = check_host(info.mem_available, host_need(argv, len(devices), margin))
    short = [c.text for c in checks if not c.ok]
    if short or not host_ok:
        return Verdict.fail, "; ".join([*short, *([] if host_ok else [host_text])])
    return Verdict.ok, "; ".join([*(c.text for c in checks), host_text])


def check_discrete(ctx: PreflightContext, devices: list[GpuDevice], info: MemInfo,
                   utilization: float) -> CheckResult:
    devices = [without(d, ctx.protect) for d in devices]
    pids = {p.pid for d in devices for p in d.processes}
    cmdlines = {pid: describe_cmdline(read_cmdline(ctx.proc_root, pid), 80) for pid in pids}
    verdict, found = assess(devices, utilization, cmdlines, info, ctx.spec.argv,
                            int(ctx.cfg.preflight.memory_margin_gib * GIB))
    if verdict is Verdict.fail:
        return CheckResult(verdict, found + "; stop what holds the memory or lower gpu_memory_utilization",
                           failure_class=FailureClass.free_memory_refusal)
    return CheckResult(verdict, found)
