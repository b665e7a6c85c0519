"""One reading of the node's GPUs for whoever asks (preflight, the daemon's sampler, incidents): NVML in a
worker thread, ``nvidia-smi`` when NVML cannot be had from Python; and the launch's devices among them."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import anyio

from sparkd.config import Config
from sparkd.gpu import nvml, smi
from sparkd.gpu.model import GpuView
from sparkd.gpu.scope import Scope, launch_scope


async def read_gpus(reader: nvml.NvmlReader | None = None) -> GpuView:
    """NVML's reading; where NVML cannot start from here but ``nvidia-smi`` answers, nvidia-smi's."""
    view = await anyio.to_thread.run_sync(reader.read if reader is not None else nvml.read_view)
    if view.available or view.source == "nvml":
        return view
    fallback = await smi.read_view_smi(time.time())
    return fallback if fallback.available else view


def scope_of(cfg: Config, runtime: str, env: Mapping[str, str], image_env: Mapping[str, str] | None = None) -> Scope:
    """The devices of this node's launch: the launch's environment over the daemon's own (process runtime) or
    over the image's, with the container's device request (docker runtimes)."""
    if runtime == "process" or runtime == "fake":
        return launch_scope({**os.environ, **env})
    return launch_scope({**(image_env or {}), **env}, container=True, gpus=cfg.container.gpus)
