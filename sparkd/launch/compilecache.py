"""Where vLLM's and FlashInfer's compile caches live where vLLM runs, and whether they outlive the container. Pure.

On the host they persist (vLLM's default ``~/.cache/vllm``). In a container they live in its own layer unless a
writable mount holds them: docker-run makes a new container for every launch, so sparkd binds a persistent host
directory there (``[container] compile_cache_dir``: ``vllm/`` and ``flashinfer/`` in it) unless a configured mount
covers the place already; docker-exec's long-lived container keeps them until it is recreated, and lint warns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sparkd.config import Config, RuntimeKind

VLLM = "vLLM's compile cache"
FLASHINFER = "FlashInfer's JIT cache"
HOST_SUBDIR = {VLLM: "vllm", FLASHINFER: "flashinfer"}


def compile_cache_dirs(cfg: Config, env: Mapping[str, str]) -> dict[str, str]:
    """Where vLLM and FlashInfer keep their compile caches inside the container (``env``: vLLM's environment)."""
    user = cfg.container.user
    home = "/root" if user is None or user.split(":")[0] in ("root", "0") else None
    cache = env.get("XDG_CACHE_HOME") or (f"{home}/.cache" if home else None)
    dirs = {}
    vllm = env.get("VLLM_CACHE_ROOT") or (f"{cache}/vllm" if cache else None)
    if vllm:
        dirs[VLLM] = vllm
    base = env.get("FLASHINFER_WORKSPACE_BASE") or home
    if base:
        dirs[FLASHINFER] = f"{base}/.cache/flashinfer"
    return dirs


def cache_mounts(cfg: Config, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """docker-run: (host directory, place in the container) for every compile cache no writable configured mount
    holds, under ``[container] compile_cache_dir``."""
    host = cfg.container.compile_cache_dir
    if cfg.runtime is not RuntimeKind.docker_run or host is None:
        return []
    return [(os.path.join(host, HOST_SUBDIR[what]), path) for what, path in compile_cache_dirs(cfg, env).items()
            if not _mounted(cfg, path)]


def unpersisted_caches(cfg: Config, env: Mapping[str, str]) -> dict[str, str]:
    """The compile caches that live in the container's own layer: on no writable mount, configured or sparkd's."""
    if not cfg.runtime.in_container:
        return {}
    ours = {target for _, target in cache_mounts(cfg, env)}
    return {what: path for what, path in compile_cache_dirs(cfg, env).items()
            if not _mounted(cfg, path) and path not in ours}


def _mounted(cfg: Config, path: str) -> bool:
    return any(_under(path, m.target) for m in cfg.container.mounts if not m.read_only)


def _under(path: str, mount: str) -> bool:
    mount = mount.rstrip("/") or "/"
    return path == mount or path.startswith(mount + "/") or mount == "/"
