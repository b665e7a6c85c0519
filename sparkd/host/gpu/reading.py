"""One reading of the node's GPUs for whoever asks (preflight, the daemon's sampler, incidents): NVML in a
worker thread, ``nvidia-smi`` when NVML cannot be had from Python; and the launch's devices among them, by the
one decision of which GPUs a launch uses (:mod:`sparkd.launch.devices`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import anyio

from sparkd.config import Config
from sparkd.host.gpu import nvml, smi
from sparkd.host.gpu.model import WEDGED, GpuDevice, GpuView, skipped
from sparkd.launch.devices import Devices, Gpu, launch_devices
from sparkd.launch.render import effective_env, env_values

TIMEOUT_S = 30.0  # NVML and nvidia-smi can hang on a wedged GPU
NO_DRIVER_RECHECK_S = 60.0  # a node without the NVIDIA library is asked again this often (a driver may be installed)
_no_driver: tuple[float, GpuView] | None = None  # (until, the reading) for the process-wide reader
__all__ = ["TIMEOUT_S", "WEDGED", "devices_of_launch", "pick", "read_gpus"]


async def read_gpus(reader: nvml.NvmlReader | None = None) -> GpuView:
    """NVML's reading; where NVML cannot start from here but ``nvidia-smi`` answers, nvidia-smi's."""
    global _no_driver
    read = reader.read if reader is not None else nvml.read_view
    if reader is None and _no_driver is not None and time.monotonic() < _no_driver[0]:
        view = _no_driver[1]  # no library here: no worker thread on every stop of a GPU-less node
    else:
        try:
            with anyio.fail_after(TIMEOUT_S):
                view = await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
        except TimeoutError:
            return skipped(f"{WEDGED} within {TIMEOUT_S:.0f} s (NVML): the GPU or its driver is wedged (a reboot "
                           "is likely needed)", time.time())
        if reader is None and not view.available and view.source != "nvml":
            _no_driver = (time.monotonic() + NO_DRIVER_RECHECK_S, view)
    if view.available or view.source == "nvml":
        return view
    fallback = await smi.read_view_smi(time.time())
    return fallback if fallback.available else view


def devices_of_launch(cfg: Config, runtime: str, env: Mapping[str, str],
                      host_env: Mapping[str, str] | None = None) -> Devices:
    """Which GPUs this node's launch uses (``sparkd.launch.devices``: the environment vLLM starts with — on the
    host sparkd's own, ``host_env`` (default ``os.environ``), under the launch's ``env`` —, its container's
    request)."""
    container = runtime != "process"
    whole = env_values(effective_env(cfg, host_env=host_env, exports=env, runtime=runtime))
    return launch_devices(whole, container=container, gpus=cfg.container.gpus if container else None)


def pick(devices: Devices, gpus: Sequence[GpuDevice]) -> list[GpuDevice]:
    """The launch's devices among a reading's."""
    chosen = {g.uuid for g in devices.select([Gpu(d.index, d.uuid) for d in gpus])}
    return [d for d in gpus if d.uuid in chosen]
