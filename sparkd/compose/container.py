"""A compose service's container settings as ``[container]`` keys, and what cannot be carried.

Carried: image, container_name, network_mode host, ipc host, shm_size, ulimits, gpus (and the nvidia device
reservation), devices, volumes (bind and named), environment and env_file, privileged, runtime, user,
security_opt, cap_add, mem_limit, memswap_limit, oom_score_adj, labels; stop_grace_period becomes
``[supervisor] stop_grace_s``. Everything else is named as not carried, with the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkd.compose.interpolate import ComposeError, read_env_file

# Keys sparkd decides itself, or that a supervised vLLM container does not need, and why.
NOT_CARRIED = {
    "restart": "sparkd decides restarts (with backoff and a budget); the container's restart policy stays 'no'",
    "healthcheck": "sparkd probes /health, /metrics and a canary request itself",
    "depends_on": "no ordering between compose services; a pair's worker-first start is sparkd's",
    "build": "build the image on each node yourself; cluster.image_match = 'label' compares such builds",
    "networks": "only network_mode host (or the default network) is expressible",
    "ports": "with host networking vLLM's ports are the host's; otherwise no port is published",
    "logging": "sparkd keeps vLLM's log itself ([supervisor] log_max_bytes)",
    "init": "not expressible",
    "tmpfs": "not expressible",
    "sysctls": "not expressible; [preflight] checks the host's vm settings",
    "working_dir": "not expressible",
    "hostname": "not expressible",
    "extra_hosts": "not expressible",
    "cap_drop": "not expressible",
    "pid": "not expressible",
    "profiles": "not expressible",
    "stdin_open": "not needed",
    "tty": "not needed",
}
HANDLED = {
    "image", "container_name", "network_mode", "ipc", "shm_size", "ulimits", "gpus", "devices", "volumes",
    "environment", "env_file", "privileged", "runtime", "user", "security_opt", "cap_add", "mem_limit",
    "memswap_limit", "oom_score_adj", "labels", "stop_grace_period", "command", "entrypoint", "deploy",
}


def _pairs(value: Any, where: str) -> dict[str, str]:
    """A compose mapping written as a mapping or as a list of ``K=V`` strings."""
    if isinstance(value, Mapping):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for item in value:
            name, eq, val = str(item).partition("=")
            if not eq:
                val = os.environ.get(name, "")
            out[name] = val
        return out
    raise ComposeError(f"{where}: expected a mapping or a list of KEY=VALUE")


def _mount(volume: Any, base: Path, where: str, notes: list[str]) -> dict[str, Any] | None:
    if isinstance(volume, Mapping):
        kind = volume.get("type", "volume")
        if kind not in ("bind", "volume") or not volume.get("source"):
            notes.append(f"{where}: a {kind} mount without a source is not carried")
            return None
        source, target, read_only = str(volume["source"]), str(volume.get("target", "")), bool(volume.get("read_only"))
    else:
        parts = str(volume).split(":")
        if len(parts) == 1:
            notes.append(f"{where}: the anonymous volume {parts[0]} is not carried (it is lost with the container)")
            return None
        source, target = parts[0], parts[1]
        read_only = len(parts) > 2 and "ro" in parts[2].split(",")
    if source.startswith("."):
        source = str((base / source).resolve())
    return {"source": source, "target": target, "read_only": read_only}


def _gpus(service: Mapping[str, Any], notes: list[str]) -> str | None:
    if "gpus" in service:
        gpus = service["gpus"]
        return "all" if gpus in ("all", -1) else str(gpus)
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    for device in reservations.get("devices") or []:
        if "gpu" in [c for caps in [device.get("capabilities") or []] for c in caps]:
            if device.get("device_ids"):
                return "device=" + ",".join(map(str, device["device_ids"]))
            count = device.get("count", "all")
            return "all" if count in ("all", -1) else str(count)
    if service.get("deploy"):
        notes.append("deploy: only the GPU reservation is carried")
    return None


def _device(item: Any) -> str:
    if isinstance(item, Mapping):
        return ":".join(str(item[k]) for k in ("source", "target", "permissions") if item.get(k))
    return str(item)


def _duration_s(text: Any, where: str) -> float:
    if isinstance(text, int | float):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text).replace(" ", ""):
        raise ComposeError(f"{where}: {text!r} is not a duration like '90s' or '1m30s'")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}
    return sum(float(n) * scale[u] for n, u in parts)


def container_section(service: Mapping[str, Any], name: str, base: Path,
                      notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``[container]`` keys, ``[supervisor]`` keys) of the service; ``notes`` gets what was not carried."""
    where = f"services.{name}"
    if not service.get("image"):
        raise ComposeError(f"{where}.image: required (sparkd runs an image; build it first and name it here)")
    out: dict[str, Any] = {"name": str(service.get("container_name") or name), "image": str(service["image"])}
    out["host_network"] = service.get("network_mode") == "host"
    if service.get("network_mode") not in (None, "host"):
        notes.append(f"{where}.network_mode: {service['network_mode']!r} is not carried (only 'host')")
    out["host_ipc"] = service.get("ipc") == "host"
    if service.get("ipc") not in (None, "host"):
        notes.append(f"{where}.ipc: {service['ipc']!r} is not carried (only 'host')")
    out["gpus"] = _gpus(service, notes)
    env: dict[str, str] = {}
    for i, file in enumerate([service["env_file"]] if isinstance(service.get("env_file"), str)
                             else service.get("env_file") or []):
        path = file.get("path") if isinstance(file, Mapping) else file
        env.update(read_env_file(base / str(path)) if path else {})
        if not path:
            notes.append(f"{where}.env_file[{i}]: no path")
    env.update(_pairs(service.get("environment") or {}, f"{where}.environment"))
    out["env"] = env
    mounts = [_mount(v, base, f"{where}.volumes[{i}]", notes) for i, v in enumerate(service.get("volumes") or [])]
    out["mounts"] = [m for m in mounts if m]
    simple = {"shm_size": "shm_size", "privileged": "privileged", "runtime": "runtime", "user": "user",
              "security_opt": "security_opt", "cap_add": "cap_add", "mem_limit": "memory",
              "memswap_limit": "memory_swap", "oom_score_adj": "oom_score_adj", "ulimits": "ulimits"}
    for compose_key, key in simple.items():
        if service.get(compose_key) is not None:
            out[key] = service[compose_key]
    if service.get("devices"):
        out["devices"] = [_device(d) for d in service["devices"]]
    if service.get("labels"):
        out["labels"] = _pairs(service["labels"], f"{where}.labels")
    supervisor = {}
    if service.get("stop_grace_period") is not None:
        supervisor["stop_grace_s"] = _duration_s(service["stop_grace_period"], f"{where}.stop_grace_period")
    for compose_key in service:
        if compose_key in NOT_CARRIED:
            notes.append(f"{where}.{compose_key}: not carried: {NOT_CARRIED[compose_key]}")
        elif compose_key not in HANDLED:
            notes.append(f"{where}.{compose_key}: not carried: sparkd has no such setting")
    return {k: v for k, v in out.items() if v is not None}, supervisor
