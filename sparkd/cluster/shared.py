"""Pure pair decisions: which launch settings must agree, and what a worker's status says about its rank."""

from __future__ import annotations

from typing import Any

from sparkd.config import Config

RUNNING_STATES = ("starting", "ready", "degraded")


def shared_settings(cfg: Config) -> dict[str, Any]:
    """Launch settings every rank of one instance must share."""
    launch = cfg.launch
    return {
        "model": launch.model, "tensor_parallel_size": launch.tensor_parallel_size,
        "pipeline_parallel_size": launch.pipeline_parallel_size, "max_model_len": launch.max_model_len,
        "kv_cache_dtype": launch.kv_cache_dtype, "master_addr": cfg.master_addr, "master_port": cfg.master_port,
        "nnodes": cfg.nnodes,
    }


def differences(local: dict[str, Any], remote: dict[str, Any], *, peer: str) -> list[str]:
    """One phrase per setting that differs, naming both values."""
    out = []
    for key in sorted(local.keys() | remote.keys()):
        if local.get(key) != remote.get(key):
            out.append(f"{key} is {local.get(key)!r} here but {remote.get(key)!r} on {peer}")
    return out


def image_difference(local: str | None, remote: str | None, *, peer: str) -> str | None:
    if local and remote and local != remote:
        return f"the image is {local[:19]} here but {remote[:19]} on {peer}"
    return None


def rank_waiting_or_later(status: dict[str, Any]) -> bool:
    """The worker's rank process is up and has reached torch.distributed init (or beyond)."""
    if status.get("state") not in RUNNING_STATES or not status.get("pid"):
        return False
    return status.get("phase") not in (None, "launching")


def rank_gone(status: dict[str, Any]) -> bool:
    """The worker reports no running rank (it failed, stopped, or never started)."""
    return status.get("state") not in (*RUNNING_STATES, "preflight", "adopting")


def peer_base_url(peer: str, default_port: int) -> str:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address → the peer's base URL."""
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        return f"http://[{host}]:{rest.lstrip(':') or default_port}"
    if peer.count(":") == 1:
        host, port = peer.split(":")
        return f"http://{host}:{port}"
    if ":" in peer:
        return f"http://[{peer}]:{default_port}"
    return f"http://{peer}:{default_port}"
