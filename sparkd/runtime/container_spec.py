"""The container sparkd creates, rendered from ``[container]``: keyword arguments for the engine's create call.

Mounts: absolute sources bind, other sources are named volumes. A rehearsal adds the host's Python, venv and
sparkd source read-only at the same place, so the stand-in runs inside (system directories are never mounted:
they would replace the image's own userland).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from docker.types import DeviceRequest, Ulimit
from docker.types import Mount as DockerMount

import sparkd
from sparkd.config import Config
from sparkd.launch.compilecache import cache_mounts
from sparkd.launch.probe import probe_dir
from sparkd.launch.rehearsal import standin_source_root
from sparkd.launch.render import effective_env
from sparkd.vllm_probe import PLUGIN_DIR

_SYSTEM_DIRS = frozenset({"/", "/usr", "/usr/local", "/etc", "/bin", "/lib", "/lib64", "/sbin", "/opt", "/var"})


def sparkd_source_root() -> str:
    """The directory holding the ``sparkd`` package (the repo, for an editable install)."""
    return str(Path(sparkd.__file__).resolve().parent.parent)


def outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without duplicates and without those nested inside another one, in order."""
    normal = list(dict.fromkeys(os.path.normpath(p) for p in paths))
    return [p for p in normal if not any(q != p and p.startswith(q.rstrip("/") + "/") for q in normal)]


def rehearse_paths() -> list[str]:
    """Host paths a rehearsal needs at the same place inside the container: the interpreter the venv was
    made from, the venv, sparkd's source and the stand-in's (``sparkd-standin`` runs there). System
    directories are left out (see _SYSTEM_DIRS)."""
    candidates = [sys.base_prefix, sys.prefix, sparkd_source_root(), standin_source_root() or sys.prefix]
    return [p for p in outermost(candidates) if p not in _SYSTEM_DIRS]


def covered(path: str, mounts: Iterable[tuple[str, str]]) -> bool:
    """Whether host ``path`` is visible at the same place through one of the (source, target) mounts."""
    real = os.path.realpath(path)
    for source, target in mounts:
        target = os.path.normpath(target)
        if path != target and not path.startswith(target.rstrip("/") + "/"):
            continue
        rest = os.path.relpath(path, target)
        if os.path.realpath(os.path.join(source, rest)) == real:
            return True
    return False


def probe_mounts(cfg: Config, *, existing: bool = True) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of the step probe's mounts, each at its host path: the plugin's directory
    read-only, the step files' directory writable (``existing``: only once it exists, as a bind mount needs; the
    runtime makes it first) — those no configured mount already shows there; none when the probe is off."""
    folder = probe_dir(cfg)
    if folder is None:
        return []
    mounts = [(str(PLUGIN_DIR), str(PLUGIN_DIR), True)]
    if folder.is_dir() or not existing:
        mounts.append((str(folder), str(folder), False))
    configured = cfg.container.mounts
    pairs = [(m.source, m.target) for m in configured if m.source.startswith("/")]
    targets = {os.path.normpath(m.target) for m in configured}
    return [m for m in mounts if not covered(m[1], pairs) and m[1] not in targets]


def docker_mounts(cfg: Config, extra_read_only: Iterable[str] = ()) -> list[DockerMount]:
    """``[container] mounts`` (absolute sources bind, others are named volumes), the step probe's (unless a
    configured mount already shows them), then ``extra_read_only`` host paths at the same place unless a configured
    mount already shows them there."""
    configured = cfg.container.mounts
    mounts = [
        DockerMount(target=m.target, source=m.source, read_only=m.read_only,
                    type="bind" if m.source.startswith("/") else "volume")
        for m in configured
    ]
    pairs = [(m.source, m.target) for m in configured if m.source.startswith("/")]
    targets = {os.path.normpath(m.target) for m in configured}
    for source, target, read_only in probe_mounts(cfg):
        mounts.append(DockerMount(target=target, source=os.path.realpath(source), type="bind", read_only=read_only))
        targets.add(target)
    for path in extra_read_only:
        if not covered(path, pairs) and path not in targets:
            mounts.append(DockerMount(target=path, source=os.path.realpath(path), type="bind", read_only=True))
    return mounts


def compile_cache_mounts(cfg: Config) -> list[DockerMount]:
    """docker-run: the persistent host directories bound where vLLM keeps its compile caches in the container
    (sparkd.launch.compilecache); the caller creates the host directories."""
    env = {name: setting.value for name, setting in effective_env(cfg).items()}
    return [DockerMount(target=target, source=source, type="bind") for source, target in cache_mounts(cfg, env)]


def device_requests(gpus: str | None) -> list[DeviceRequest] | None:
    """``--gpus`` as the API's device requests: ``all``, a count, or ``device=0,1`` / ``0,1``."""
    if not gpus:
        return None
    spec = gpus.strip().strip("\"'")
    if spec == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if spec.isdigit():
        return [DeviceRequest(count=int(spec), capabilities=[["gpu"]])]
    ids = [part.strip() for part in spec.removeprefix("device=").split(",") if part.strip()]
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


def container_options(
    cfg: Config, *, entrypoint: list[str], labels: Mapping[str, str], rehearse: bool,
    name: str | None, gpus: bool = True, env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create`` from ``[container]``.

    The image's ENTRYPOINT is replaced by ``entrypoint`` (a vLLM image's entrypoint would otherwise swallow
    it); restart policy is off: sparkd decides about restarts.
    """
    cc = cfg.container
    options: dict[str, Any] = {
        "image": cc.image,
        "entrypoint": list(entrypoint),
        "command": [],
        "mounts": docker_mounts(cfg, rehearse_paths() if rehearse else ()),
        "environment": {**cc.env, **(env or {})},
        "labels": dict(labels),
        "restart_policy": {"Name": "no"},
        "detach": True,
    }
    if name:
        options["name"] = name
    if cc.shm_size:
        options["shm_size"] = cc.shm_size
    if cc.host_network:
        options["network_mode"] = "host"
    if cc.host_ipc:
        options["ipc_mode"] = "host"
    options.update(host_options(cfg))
    requests_ = device_requests(cc.gpus) if gpus else None
    if requests_:
        options["device_requests"] = requests_
    return options


def host_options(cfg: Config) -> dict[str, Any]:
    """The host-facing settings of ``[container]`` as create keywords: only those set, so the engine's own
    defaults stay visible as such in ``docker inspect``."""
    cc = cfg.container
    options: dict[str, Any] = {}
    if cc.cap_add:
        options["cap_add"] = list(cc.cap_add)
    if cc.privileged:
        options["privileged"] = True
    if cc.devices:
        options["devices"] = list(cc.devices)
    if cc.ulimits:
        options["ulimits"] = [Ulimit(name=name, soft=u.soft, hard=u.hard) for name, u in cc.ulimits.items()]
    if cc.memory is not None:
        options["mem_limit"] = cc.memory
    if cc.memory_swap is not None:
        options["memswap_limit"] = cc.memory_swap
    if cc.oom_score_adj is not None:
        options["oom_score_adj"] = cc.oom_score_adj
    if cc.runtime:
        options["runtime"] = cc.runtime
    if cc.user:
        options["user"] = cc.user
    if cc.security_opt:
        options["security_opt"] = list(cc.security_opt)
    return options


def missing_devices(cfg: Config) -> list[str]:
    """``[container] devices`` whose host path does not exist on this host."""
    return [d.split(":", 1)[0] for d in cfg.container.devices if not os.path.exists(d.split(":", 1)[0])]


def missing_rehearse_mounts(container_attrs: Mapping[str, Any]) -> list[str]:
    """The rehearsal paths an existing container does not show at the same place."""
    pairs = [(m.get("Source", ""), m.get("Destination", "")) for m in container_attrs.get("Mounts") or []]
    return [p for p in rehearse_paths() if not covered(p, pairs)]
