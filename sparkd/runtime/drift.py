"""Drift: how an existing container differs from ``[container]``, key by key. Pure: it reads ``docker inspect`` of
the container and of the configured image, both as the engine returns them.

Rules:

1. Each difference names the config key it is about (``container.privileged``), what the config says and what
   the container has. For a list (mounts, devices, env, caps, security options) only the differing items are
   named: what the config has that the container lacks, and what the container has beyond the config.
2. Compared always: the image (by id when the configured image is on this node, else by name), mounts, devices,
   privileged, ulimits, env, network and IPC mode, the GPU request, capabilities, memory ceiling and
   oom_score_adj. The container's own /dev/shm size only without host IPC (with it, /dev/shm is the host's).
3. Compared only when configured: the OCI runtime (the engine's default runtime may be nvidia already), the user
   (the image sets its own), memory+swap and the security options; the main command never (a hand-made
   container's ``sleep infinity`` serves as well as sparkd's).
4. The container's environment is what it was created with beyond the image's ENV; a rehearsal's read-only
   mounts of the host's Python are not drift.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sparkd.config import Config
from sparkd.config.container import DOCKER_DEFAULT_SHM, UNLIMITED
from sparkd.config.secretrule import digest, is_secret_name
from sparkd.runtime.base import Difference
from sparkd.runtime.container_spec import device_requests, probe_mounts, rehearse_paths


def short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def env_map(entries: Iterable[str] | None) -> dict[str, str]:
    """``["K=V", ...]`` (docker inspect's Config.Env) as a mapping."""
    out: dict[str, str] = {}
    for entry in entries or ():
        name, _, value = entry.partition("=")
        out[name] = value
    return out


def _listed(key: str, configured: Iterable[Any], actual: Iterable[Any]) -> Iterator[Difference]:
    want, have = set(configured), set(actual)
    if want != have:
        yield Difference(key, sorted(want - have, key=str), sorted(have - want, key=str))


def _scalar(key: str, configured: Any, actual: Any) -> Iterator[Difference]:
    if configured != actual:
        yield Difference(key, configured, actual)


def _image(cfg: Config, attrs: Mapping[str, Any], image: Mapping[str, Any] | None) -> Iterator[Difference]:
    want = cfg.container.image
    have_id, have_name = str(attrs.get("Image", "")), str((attrs.get("Config") or {}).get("Image", ""))
    if image is not None:
        want_id = str(image.get("Id", ""))
        if want_id != have_id:
            yield Difference("container.image", f"{want} ({short(want_id)})", f"{have_name} ({short(have_id)})")
    elif have_name != want:
        yield Difference("container.image", f"{want} (not on this node)", f"{have_name} ({short(have_id)})")


def _mounts(cfg: Config, attrs: Mapping[str, Any]) -> Iterator[Difference]:
    want = {(m.source, m.target, m.read_only) for m in cfg.container.mounts}
    want |= {(os.path.realpath(s), t, ro) for s, t, ro in probe_mounts(cfg, existing=False)}
    have = set()
    for m in attrs.get("Mounts") or []:
        source = m.get("Name") if m.get("Type") == "volume" else os.path.normpath(m.get("Source", ""))
        have.add((source, os.path.normpath(m.get("Destination", "")), not m.get("RW", True)))
    rehearsal = set(rehearse_paths())
    have = {m for m in have if not (m[1] in rehearsal and m[2] and m not in want)}
    yield from _listed("container.mounts", (_mount_text(m) for m in want), (_mount_text(m) for m in have))


def _mount_text(mount: tuple[str, str, bool]) -> str:
    source, target, read_only = mount
    return f"{source}:{target}" + (":ro" if read_only else "")


def _devices(cfg: Config, host: Mapping[str, Any]) -> Iterator[Difference]:
    have = [f"{d.get('PathOnHost')}:{d.get('PathInContainer')}:{d.get('CgroupPermissions')}"
            for d in host.get("Devices") or []]
    yield from _listed("container.devices", cfg.container.devices, have)


def _ulimits(cfg: Config, host: Mapping[str, Any]) -> Iterator[Difference]:
    want = {f"{name}={u.soft}:{u.hard}" for name, u in cfg.container.ulimits.items()}
    have = {f"{u.get('Name')}={u.get('Soft')}:{u.get('Hard')}" for u in host.get("Ulimits") or []}
    yield from _listed("container.ulimits", want, have)


def _env(cfg: Config, attrs: Mapping[str, Any], image: Mapping[str, Any] | None) -> Iterator[Difference]:
    have = env_map((attrs.get("Config") or {}).get("Env"))
    want = dict(cfg.container.env)
    if image is None:  # the image's ENV is unknown: only the keys the config sets can be compared
        have = {k: v for k, v in have.items() if k in want}
    else:
        image_env = env_map((image.get("Config") or {}).get("Env"))
        have = {k: v for k, v in have.items() if image_env.get(k) != v}
        want = {k: v for k, v in want.items() if image_env.get(k) != v}
    names = cfg.launch.secret_env

    def item(name: str, value: str) -> str:  # a secret is compared by its digest, never shown
        return f"{name}={digest(value) if is_secret_name(name, names) else value}"

    yield from _listed("container.env", (item(k, v) for k, v in want.items()), (item(k, v) for k, v in have.items()))


def _gpus(cfg: Config, host: Mapping[str, Any]) -> Iterator[Difference]:
    def norm(requests: Iterable[Mapping[str, Any]]) -> set[str]:
        return {f"count={r.get('Count')} ids={','.join(r.get('DeviceIDs') or [])}" for r in requests}

    want = norm(device_requests(cfg.container.gpus) or [])
    yield from _listed("container.gpus", want, norm(host.get("DeviceRequests") or []))


def _caps(values: Iterable[str] | None) -> list[str]:
    return [c.upper().removeprefix("CAP_") for c in values or ()]


def container_drift(cfg: Config, attrs: Mapping[str, Any], image: Mapping[str, Any] | None) -> list[Difference]:
    """Every way the container ``attrs`` (``docker inspect``) differs from ``[container]``; ``image``: inspect of
    the configured image on this node, None when it is not there."""
    cc, host = cfg.container, attrs.get("HostConfig") or {}
    out = [*_image(cfg, attrs, image), *_mounts(cfg, attrs), *_devices(cfg, host)]
    out += _scalar("container.privileged", cc.privileged, bool(host.get("Privileged")))
    out += [*_ulimits(cfg, host), *_env(cfg, attrs, image)]
    out += _scalar("container.host_network", cc.host_network, host.get("NetworkMode") == "host")
    out += _scalar("container.host_ipc", cc.host_ipc, host.get("IpcMode") == "host")
    if not cc.host_ipc:
        out += _scalar("container.shm_size", cc.shm_size or DOCKER_DEFAULT_SHM, host.get("ShmSize"))
    out += [*_gpus(cfg, host), *_listed("container.cap_add", _caps(cc.cap_add), _caps(host.get("CapAdd")))]
    out += _scalar("container.memory", cc.memory or 0, host.get("Memory") or 0)
    out += _scalar("container.oom_score_adj", cc.oom_score_adj or 0, host.get("OomScoreAdj") or 0)
    out += [*_configured_only(cfg, attrs, host)]
    return out


def _configured_only(cfg: Config, attrs: Mapping[str, Any], host: Mapping[str, Any]) -> Iterator[Difference]:
    cc = cfg.container
    if cc.runtime is not None:
        yield from _scalar("container.runtime", cc.runtime, host.get("Runtime"))
    if cc.user is not None:
        yield from _scalar("container.user", cc.user, (attrs.get("Config") or {}).get("User") or "")
    if cc.memory_swap is not None:
        swap = host.get("MemorySwap")
        yield from _scalar("container.memory_swap", cc.memory_swap, UNLIMITED if swap == UNLIMITED else swap)
    if cc.security_opt:
        yield from _listed("container.security_opt", cc.security_opt, host.get("SecurityOpt") or [])
