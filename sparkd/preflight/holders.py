"""Naming a neighbour that holds what this launch needs (a port, a GPU, memory): PID, command line, the
container it runs in and the sparkd instance whose launch it is, so that the operator knows whom to ask.

The container is read from ``/proc/PID/cgroup`` (Docker's and containerd's 64-hex container id in the path) and
named by asking the Docker engine, when one answers within a second; else the short id is shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import anyio

from sparkd.preflight.base import describe_cmdline, read_cmdline, read_text

_CONTAINER_ID = re.compile(r"(?:docker|containerd|crio|libpod)[-/:]([0-9a-f]{64})|/([0-9a-f]{64})(?:\.scope)?$")
ENGINE_TIMEOUT_S = 1.0


def container_id(cgroup_text: str | None) -> str | None:
    """The container id in a process's ``/proc/PID/cgroup``, if it runs in a container."""
    for line in (cgroup_text or "").splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            match = _CONTAINER_ID.search("/" + part)
            if match:
                return match.group(1) or match.group(2)
    return None


def container_of(proc_root: Path, pid: int) -> str | None:
    return container_id(read_text(proc_root / str(pid) / "cgroup"))


def describe(pid: int, cmdline: str, container: str | None = None, owner: str = "",
             names: Mapping[str, str] | None = None) -> str:
    """Pure: ``PID 123 (vllm serve m) in container vllm_b, of sparkd instance b (config …)``."""
    text = f"PID {pid} ({cmdline})"
    if container:
        text += f" in container {(names or {}).get(container) or container[:12]}"
    if owner:
        text += f", of {owner}"
    return text


def _names(ids: list[str]) -> dict[str, str]:
    import docker

    client = docker.from_env(timeout=ENGINE_TIMEOUT_S)
    try:
        out = {}
        for cid in ids:
            try:
                out[cid] = str(client.containers.get(cid).name)
            except docker.errors.DockerException:
                continue
        return out
    finally:
        client.close()


async def container_names(ids: Iterable[str]) -> dict[str, str]:
    """Container id → name from the Docker engine; {} when none answers."""
    wanted = sorted({i for i in ids if i})
    if not wanted:
        return {}
    try:
        with anyio.fail_after(ENGINE_TIMEOUT_S * (len(wanted) + 1)):
            return await anyio.to_thread.run_sync(_names, wanted, abandon_on_cancel=True)
    except Exception:  # no engine, no permission, a timeout: the short id is shown
        return {}


def cmdline_of(proc_root: Path, pid: int) -> str:
    return describe_cmdline(read_cmdline(proc_root, pid))
