"""A compose service's container settings as ``[container]`` keys, and what cannot be carried.

Carried: image, container_name, network_mode host, ipc host, shm_size, ulimits, gpus (and the GPU device
reservation of ``deploy.resources``, with its memory limit), devices, volumes (bind and named), environment and
env_file (``required: false`` honoured), privileged, runtime, user, security_opt, cap_add, mem_limit,
memswap_limit, oom_score_adj, labels; stop_grace_period becomes ``[supervisor] stop_grace_s``. ``x-``
extensions are compose's place for the author's own keys and are passed over; everything else is named as not
carried, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkd.cli.compose.interpolate import ComposeError, key_path, read_env_file
from sparkd.cli.compose.shapes import mapping, scalar, sequence

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
    "profiles": "sparkd runs the service whenever sparkd runs; compose's profiles have no meaning there",
    "stdin_open": "not needed",
    "tty": "not needed",
}
HANDLED = {
    "image", "container_name", "network_mode", "ipc", "shm_size", "ulimits", "gpus", "devices", "volumes",
    "environment", "env_file", "privileged", "runtime", "user", "security_opt", "cap_add", "mem_limit",
    "memswap_limit", "oom_score_adj", "labels", "stop_grace_period", "command", "entrypoint", "deploy",
}


def _pairs(value: Any, where: str, variables: Mapping[str, str]) -> dict[str, str]:
    """A compose mapping written as a mapping or as a list of ``K=V`` strings (``K`` alone: from the shell)."""
    if isinstance(value, Mapping):
        return {str(k): "" if v is None else scalar(v, key_path(where, k)) for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            name, eq, val = scalar(item, f"{where}[{i}]").partition("=")
            out[name] = val if eq else variables.get(name, "")
        return out
    raise ComposeError(f"{where}: expected a mapping or a list of KEY=VALUE")


def _mount(volume: Any, base: Path, where: str, notes: list[str]) -> dict[str, Any] | None:
    if isinstance(volume, Mapping):
        kind = volume.get("type", "volume")
        if kind not in ("bind", "volume") or not volume.get("source"):
            notes.append(f"{where}: a {kind} mount without a source is not carried")
            return None
        source = scalar(volume["source"], f"{where}.source")
        target = scalar(volume.get("target", ""), f"{where}.target")
        read_only = bool(volume.get("read_only"))
    else:
        parts = scalar(volume, where).split(":")
        if len(parts) == 1:
            notes.append(f"{where}: the anonymous volume {parts[0]} is not carried (it is lost with the container)")
            return None
        source, target = parts[0], parts[1]
        read_only = len(parts) > 2 and "ro" in parts[2].split(",")
    if source.startswith("."):
        source = str((base / source).resolve())
    return {"source": source, "target": target, "read_only": read_only}


def _count(value: Any) -> str:
    return "all" if value in ("all", -1, None) else str(value)


def _gpus(service: Mapping[str, Any], where: str, notes: list[str]) -> tuple[str | None, Any]:
    """(``[container] gpus``, the memory limit of ``deploy.resources.limits``)."""
    deploy = mapping(service.get("deploy"), f"{where}.deploy")
    resources = mapping(deploy.get("resources"), f"{where}.deploy.resources")
    limits = mapping(resources.get("limits"), f"{where}.deploy.resources.limits")
    reservations = mapping(resources.get("reservations"), f"{where}.deploy.resources.reservations")
    uncarried = sorted({*deploy} - {"resources"}) + sorted({*resources} - {"limits", "reservations"}) + sorted(
        {*limits} - {"memory"}) + sorted({*reservations} - {"devices"})
    if uncarried:
        notes.append(f"{where}.deploy: only the GPU reservation and the memory limit are carried (not "
                     f"{', '.join(uncarried)})")
    gpus = None
    devices = sequence(reservations.get("devices"), f"{where}.deploy.resources.reservations.devices")
    for i, raw in enumerate(devices):
        device = mapping(raw, f"{where}.deploy.resources.reservations.devices[{i}]")
        capabilities = sequence(device.get("capabilities"), f"{where}.deploy...devices[{i}].capabilities")
        flat = [c for cap in capabilities for c in (cap if isinstance(cap, list) else [cap])]  # [[gpu]] too
        if "gpu" in flat and gpus is None:
            ids = sequence(device.get("device_ids"), f"{where}.deploy...devices[{i}].device_ids")
            gpus = "device=" + ",".join(scalar(d, f"{where}.deploy...device_ids") for d in ids) if ids else \
                _count(device.get("count"))
    if "gpus" in service:
        gpus = _count(service["gpus"])
    return gpus, limits.get("memory")


def _device(item: Any) -> str:
    if isinstance(item, Mapping):
        return ":".join(scalar(item[k], "devices") for k in ("source", "target", "permissions") if item.get(k))
    return scalar(item, "devices")


def _env_files(value: Any, base: Path, where: str, notes: list[str]) -> dict[str, str]:
    """The variables of ``env_file`` (a path, a list of paths, or of ``{path, required}``), in order."""
    env: dict[str, str] = {}
    files = [value] if isinstance(value, str) else sequence(value, f"{where}.env_file")
    for i, file in enumerate(files):
        entry = mapping(file, f"{where}.env_file[{i}]") if isinstance(file, Mapping) else {"path": file}
        path = entry.get("path")
        if not path:
            notes.append(f"{where}.env_file[{i}]: no path")
            continue
        full = base / scalar(path, f"{where}.env_file[{i}]")
        if entry.get("required", True) is False and not full.exists():
            continue  # compose skips an optional file that is not there
        env.update(read_env_file(full))
    return env


def _duration_s(text: Any, where: str) -> float:
    if isinstance(text, int | float):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text).replace(" ", ""):
        raise ComposeError(f"{where}: {text!r} is not a duration like '90s' or '1m30s'")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}
    return sum(float(n) * scale[u] for n, u in parts)


def container_section(service: Mapping[str, Any], name: str, base: Path, notes: list[str],
                      variables: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``[container]`` keys, ``[supervisor]`` keys) of the service; ``notes`` gets what was not carried."""
    where = key_path("services", name)
    variables = variables or {}
    if not service.get("image"):
        raise ComposeError(f"{where}.image: required (sparkd runs an image; build it first and name it here)")
    out: dict[str, Any] = {"name": scalar(service.get("container_name") or name, f"{where}.container_name"),
                           "image": scalar(service["image"], f"{where}.image")}
    out["host_network"] = service.get("network_mode") == "host"
    if service.get("network_mode") not in (None, "host"):
        notes.append(f"{where}.network_mode: {service['network_mode']!r} is not carried (only 'host')")
    out["host_ipc"] = service.get("ipc") == "host"
    if service.get("ipc") not in (None, "host"):
        notes.append(f"{where}.ipc: {service['ipc']!r} is not carried (only 'host')")
    out["gpus"], limit = _gpus(service, where, notes)
    if limit is not None and service.get("mem_limit") is None:
        out["memory"] = limit
    out["env"] = _env_files(service.get("env_file"), base, where, notes)
    out["env"].update(_pairs(service.get("environment") or {}, f"{where}.environment", variables))
    volumes = sequence(service.get("volumes"), f"{where}.volumes")
    mounts = [_mount(v, base, f"{where}.volumes[{i}]", notes) for i, v in enumerate(volumes)]
    out["mounts"] = [m for m in mounts if m]
    simple = {"shm_size": "shm_size", "privileged": "privileged", "runtime": "runtime", "user": "user",
              "security_opt": "security_opt", "cap_add": "cap_add", "mem_limit": "memory",
              "memswap_limit": "memory_swap", "oom_score_adj": "oom_score_adj", "ulimits": "ulimits"}
    for compose_key, key in simple.items():
        if service.get(compose_key) is not None:
            out[key] = service[compose_key]
    if service.get("devices"):
        out["devices"] = [_device(d) for d in sequence(service["devices"], f"{where}.devices")]
    if service.get("labels"):
        out["labels"] = _pairs(service["labels"], f"{where}.labels", variables)
    supervisor = {}
    if service.get("stop_grace_period") is not None:
        supervisor["stop_grace_s"] = _duration_s(service["stop_grace_period"], f"{where}.stop_grace_period")
    for compose_key in service:
        if compose_key.startswith("x-"):
            continue  # an extension: the author's own key, for anchors and tools; nothing to carry
        if compose_key in NOT_CARRIED:
            notes.append(f"{key_path(where, compose_key)}: not carried: {NOT_CARRIED[compose_key]}")
        elif compose_key not in HANDLED:
            notes.append(f"{key_path(where, compose_key)}: not carried: sparkd has no such setting")
    return {k: v for k, v in out.items() if v is not None}, supervisor
