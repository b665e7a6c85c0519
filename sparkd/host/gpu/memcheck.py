"""vLLM's free-memory rule, per device of the launch, and what the host itself must hold. Pure.

vLLM (``gpu_worker.py``, ``request_memory``, 0.11-0.24) refuses to start when a device's free memory is below
``gpu_memory_utilization x`` its total: "Free memory on device (F/T GiB) on startup is less than desired GPU memory
utilization (U, R GiB)". So on a discrete GPU each device of the launch must have ``free >= ceil(U x total)``;
the processes holding memory there are named when it does not. The host then needs only what it holds itself:
CPU offload (``--cpu-offload-gb``, per GPU), swap space (``--swap-space``, per GPU, when set) and the margin
(``[preflight] memory_margin_gib``, room for staging weights), against MemAvailable (page cache is reclaimable
on a discrete-GPU host). On a unified-memory device (GB10) none of this applies: the host check does it all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkd.host.gpu.model import GpuDevice, gib


def float_flag(argv: Sequence[str], flag: str) -> float | None:
    """The last ``flag VALUE`` / ``flag=VALUE`` in ``argv`` as a float; None when absent or not a number."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def need_on(device: GpuDevice, utilization: float) -> int:
    assert device.total_bytes is not None
    return math.ceil(device.total_bytes * utilization)


@dataclass(frozen=True)
class DeviceCheck:
    device: GpuDevice
    ok: bool
    text: str


def check_device(device: GpuDevice, utilization: float, cmdlines: Mapping[int, str]) -> DeviceCheck:
    """One discrete device against vLLM's rule; a short device names who holds its memory."""
    assert device.total_bytes is not None and device.free_bytes is not None
    need = need_on(device, utilization)
    terms = f"{utilization:.2f} x total {gib(device.total_bytes)} = {gib(need)}"
    label = f"{device.label} [{device.uuid}]"
    if device.free_bytes >= need:
        return DeviceCheck(device, True, f"{device.label}: free {gib(device.free_bytes)} covers {terms}")
    text = (f"{label}: free {gib(device.free_bytes)} is {gib(need - device.free_bytes)} short of {terms}, "
            "so vLLM would refuse to start")
    holders = sorted(device.processes, key=lambda p: (-(p.used_bytes or 0), p.pid))
    if holders:
        text += "; held by " + ", ".join(
            f"PID {p.pid} ({cmdlines.get(p.pid) or '?'}, {gib(p.used_bytes)})" for p in holders)
    else:
        text += f"; {gib(device.used_bytes)} is in use with no compute process listed (another container's, or " \
                "the driver's after a crash: a reboot may be needed)"
    return DeviceCheck(device, False, text)


@dataclass(frozen=True)
class HostNeed:
    bytes: int
    terms: str


def host_need(argv: Sequence[str], gpus: int, margin: int) -> HostNeed:
    """What a discrete-GPU launch holds in host memory beside the page cache: offload, swap space, the margin."""
    offload = (float_flag(argv, "--cpu-offload-gb") or 0.0) * gpus
    swap = (float_flag(argv, "--swap-space") or 0.0) * gpus
    parts = [f"{gib(margin)} margin"]
    if offload:
        parts.append(f"--cpu-offload-gb x {gpus} GPU = {offload:g} GiB")
    if swap:
        parts.append(f"--swap-space x {gpus} GPU = {swap:g} GiB")
    total = margin + int((offload + swap) * (1 << 30))
    return HostNeed(total, " + ".join(parts) + (f" = {gib(total)}" if len(parts) > 1 else ""))


def check_host(mem_available: int, need: HostNeed) -> tuple[bool, str]:
    if mem_available >= need.bytes:
        return True, f"host MemAvailable {gib(mem_available)} covers {need.terms}"
    return False, (f"host MemAvailable {gib(mem_available)} is {gib(need.bytes - mem_available)} short of "
                   f"{need.terms}")


def discrete(devices: Sequence[GpuDevice]) -> list[GpuDevice]:
    """The devices whose own memory NVML reports (not GB10's unified memory, not an unreadable one)."""
    return [d for d in devices if not d.unified and d.total_bytes is not None and d.free_bytes is not None]
