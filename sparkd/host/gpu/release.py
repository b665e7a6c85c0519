"""After a stop: is the GPU memory of the stopped processes back? Pure decision; the wait reads through a port.

A process's device memory is released when the driver tears its context down, right after the process ends
(0.12-0.17 s on H100/H200, tests/gpu/README.md). The processes are the instance's tree as it was before the stop
(host PIDs, as NVML lists them). A PID that NVML still lists past the bound is stuck in the driver (state D, the
context never torn down): only a reboot frees that memory, and launching into it fails; that is a ``gpu_error``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

import anyio

from sparkd.host.gpu.model import GpuView, gib

POLL_S = 0.05


@dataclass(frozen=True)
class Held:
    pid: int
    device: str  # "GPU 0 (NVIDIA H100 80GB HBM3)"
    used_bytes: int | None


def held_by(view: GpuView, pids: Collection[int]) -> list[Held]:
    """The compute processes among ``pids`` that still hold memory on some device."""
    return [Held(p.pid, d.label, p.used_bytes) for d in view.devices for p in d.processes if p.pid in pids]


@dataclass(frozen=True)
class Release:
    released: bool
    seconds: float
    held: tuple[Held, ...] = ()
    checked: bool = True  # False: no GPU reading to check against (no NVML, no driver)

    def sentence(self, states: Mapping[int, str] | None = None) -> str:
        if not self.checked:
            return "GPU memory release not verified: no GPU reading on this node"
        if self.released:
            return f"GPU memory of the stopped processes is back {self.seconds:.2f} s after the stop"
        states = states or {}
        who = "; ".join(f"PID {h.pid}{' (state ' + states[h.pid] + ')' if h.pid in states else ''} on {h.device} "
                        f"({gib(h.used_bytes)})" for h in self.held)
        return (f"The GPU memory of the stopped vLLM is still held {self.seconds:.0f} s after its stop: {who}. A "
                "process the driver does not let go of (stuck in the driver, state D) keeps its memory until the "
                "node reboots; sparkd will not launch into it — check `nvidia-smi` and the kernel log for an Xid, "
                "then reboot the node")


async def wait_released(read: Callable[[], Awaitable[GpuView]], pids: Collection[int], timeout_s: float, *,
                        now: Callable[[], float], sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
                        poll_s: float = POLL_S) -> Release:
    """Read until none of ``pids`` holds GPU memory, at most ``timeout_s``."""
    started = now()
    pids = frozenset(pids)
    while True:
        view = await read()
        if not view.available:
            return Release(True, now() - started, checked=False)
        held = held_by(view, pids)
        if not held:
            return Release(True, now() - started)
        if now() - started >= timeout_s:
            return Release(False, now() - started, tuple(held))
        await sleep(poll_s)
