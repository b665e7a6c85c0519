"""Which of the node's GPUs a launch uses. Pure.

CUDA sees the devices ``CUDA_VISIBLE_DEVICES`` names (indices or ``GPU-``/``MIG-`` UUID prefixes, in order; CUDA
stops at the first entry it cannot read, so ``-1`` or an empty value means none); unset, every device it can
open. In a container, the device request (``[container] gpus``: ``all``, a count, ``device=0,1``) or else
``NVIDIA_VISIBLE_DEVICES`` (``all``, ``none``, ``void``, a list) decides which host GPUs are in it, and
``CUDA_VISIBLE_DEVICES`` then picks among those by position. Indices here are NVML's (PCI bus order), which
is CUDA's on a node of identical GPUs. The result is in host terms: NVML indices or UUIDs.

(Issue 23's neighbours work writes the same decision for the stale-process sweep; once it lands this module
gives way to it.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkd.gpu.model import GpuDevice

_ENTRY = re.compile(r"^(?:\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)$")


@dataclass(frozen=True)
class Scope:
    ids: tuple[str, ...] | None  # None: every device of the node; (): none
    said_by: str  # what decided it, for sentences

    def pick(self, devices: Sequence[GpuDevice]) -> list[GpuDevice]:
        if self.ids is None:
            return list(devices)
        out: list[GpuDevice] = []
        for key in self.ids:
            found = next((d for d in devices if _is(d, key)), None)
            if found is not None and found not in out:
                out.append(found)
        return out

    def describe(self) -> str:
        if self.ids is None:
            return f"every GPU ({self.said_by})"
        if not self.ids:
            return f"no GPU ({self.said_by})"
        return f"GPU {', '.join(self.ids)} ({self.said_by})"


def _is(device: GpuDevice, key: str) -> bool:
    return key == str(device.index) if key.isdigit() else device.uuid.startswith(key)


def visible(value: str | None) -> tuple[str, ...] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: None when unset (every device); entries up to the first bad one."""
    if value is None:
        return None
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not _ENTRY.match(entry):
            break
        out.append(entry)
    return tuple(out)


def container_devices(gpus: str | None, nvidia_visible: str | None) -> tuple[str, ...] | None:
    """The host GPUs in the container: the device request first, else ``NVIDIA_VISIBLE_DEVICES``.
    None: every GPU; (): none (no request and no variable: the container gets no GPU)."""
    if gpus:
        spec = gpus.strip().strip("\"'")
        if spec == "all":
            return None
        if spec.isdigit():
            return tuple(str(i) for i in range(int(spec)))
        spec = spec.removeprefix("device=").strip("\"'")
        return tuple(p.strip() for p in spec.split(",") if p.strip())
    if nvidia_visible is None:
        return ()
    value = nvidia_visible.strip()
    if value == "all":
        return None
    if value in ("", "none", "void"):
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


def launch_scope(env: Mapping[str, str], *, container: bool = False, gpus: str | None = None) -> Scope:
    """The launch's devices from its environment (``env``: what vLLM's processes start with) and, in a
    container, its device request ``gpus`` (``[container] gpus``)."""
    cuda = visible(env.get("CUDA_VISIBLE_DEVICES"))
    said = [f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"] if "CUDA_VISIBLE_DEVICES" in env else []
    if not container:
        return Scope(cuda, ", ".join(said) or "CUDA_VISIBLE_DEVICES unset")
    outer = container_devices(gpus, env.get("NVIDIA_VISIBLE_DEVICES"))
    said.insert(0, f"--gpus {gpus}" if gpus else f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')}")
    return Scope(_within(outer, cuda), ", ".join(said))


def _within(outer: tuple[str, ...] | None, inner: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """``inner`` (CUDA_VISIBLE_DEVICES inside the container) picks among ``outer`` (the container's GPUs)."""
    if inner is None:
        return outer
    if outer is None:
        return inner
    out = []
    for key in inner:
        if key.isdigit():
            if int(key) >= len(outer):
                break  # CUDA stops at an index it cannot open
            out.append(outer[int(key)])
        else:
            out.append(key)
    return tuple(out)
