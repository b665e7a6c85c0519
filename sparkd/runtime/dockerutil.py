"""What the two Docker runtimes share: the client, container options rendered from ``[container]``, files put
into containers, the launch-target check, identity-pinned PID waits and blocking Docker calls in threads.

The Docker SDK blocks, so every call goes through a worker thread. Streams (events, logs) are read one item
per thread hop and closed by the caller, which ends an abandoned read when the caller is cancelled.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import posixpath
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import docker
import docker.errors
import requests
import urllib3
from docker.types import DeviceRequest
from docker.types import Mount as DockerMount

import sparkd
from sparkd.config import Config
from sparkd.rehearsal import standin_source_root
from sparkd.runtime import proctree
from sparkd.runtime.base import Instance, Runtime

MANAGED_LABEL = "sparkd.managed"
NODE_LABEL = "sparkd.node"
HASH_LABEL = "sparkd.config_hash"
CHECK_LABEL = "sparkd.check"  # short-lived containers that check a launch target (never adopted)

API_TIMEOUT_S = 120.0
DOCKER_ERRORS: tuple[type[Exception], ...] = (docker.errors.DockerException, requests.RequestException)
_STREAM_ERRORS: tuple[type[Exception], ...] = (
    *DOCKER_ERRORS, urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError,
)

# Never bind-mounted for a rehearsal: they would replace the image's own userland.
_SYSTEM_DIRS = frozenset({"/", "/usr", "/usr/local", "/etc", "/bin", "/lib", "/lib64", "/sbin", "/opt", "/var"})

# Exit status of CHECK_SCRIPT: 0 runnable, 1 missing, 2 not executable, 3 not on PATH.
CHECK_SCRIPT = (
    't=$1; k=$2\n'
    'if [[ $k == file ]]; then [[ -f $t ]] || exit 1; exit 0; fi\n'
    'if [[ $t == */* ]]; then [[ -e $t ]] || exit 1; [[ -x $t && ! -d $t ]] || exit 2; exit 0; fi\n'
    'command -v -- "$t" >/dev/null || exit 3\n'
)

T = TypeVar("T")


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one blocking Docker SDK call in a worker thread."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def _next_or_none(iterator: Iterator[T]) -> T | None:
    try:
        return next(iterator, None)
    except _STREAM_ERRORS:
        return None


async def next_item(iterator: Iterator[T]) -> T | None:
    """The next item of a blocking Docker stream, or None when it ended or broke.

    On cancellation the thread is abandoned; the caller must close the stream, which ends that thread.
    """
    return await anyio.to_thread.run_sync(_next_or_none, iterator, abandon_on_cancel=True)


def close_quietly(stream: Any) -> None:
    with contextlib.suppress(Exception):
        stream.close()


def explain(exc: BaseException) -> str:
    """The engine's own words for an API error, else the exception text."""
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text).strip()


def epoch_param(ns: int) -> str:
    """A ``since=`` value for the events API with nanosecond precision."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


# ---------------------------------------------------------------------------------------------------------
# Mounts and container options


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


def docker_mounts(cfg: Config, extra_read_only: Iterable[str] = ()) -> list[DockerMount]:
    """``[container] mounts`` (absolute sources bind, others are named volumes), then ``extra_read_only``
    host paths at the same place unless a configured mount already shows them there."""
    configured = cfg.container.mounts
    mounts = [
        DockerMount(target=m.target, source=m.source, read_only=m.read_only,
                    type="bind" if m.source.startswith("/") else "volume")
        for m in configured
    ]
    pairs = [(m.source, m.target) for m in configured if m.source.startswith("/")]
    targets = {os.path.normpath(m.target) for m in configured}
    for path in extra_read_only:
        if not covered(path, pairs) and path not in targets:
            mounts.append(DockerMount(target=path, source=os.path.realpath(path), type="bind", read_only=True))
    return mounts


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
    if cc.cap_add:
        options["cap_add"] = list(cc.cap_add)
    requests_ = device_requests(cc.gpus) if gpus else None
    if requests_:
        options["device_requests"] = requests_
    return options


def missing_rehearse_mounts(container_attrs: Mapping[str, Any]) -> list[str]:
    """The rehearsal paths an existing container does not show at the same place."""
    pairs = [(m.get("Source", ""), m.get("Destination", "")) for m in container_attrs.get("Mounts") or []]
    return [p for p in rehearse_paths() if not covered(p, pairs)]


# ---------------------------------------------------------------------------------------------------------
# Files and launch targets


def file_tar(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def put_file(api: Any, container_id: str, path: str, data: bytes, mode: int) -> None:
    """Write ``path`` inside the container (its directory must exist), replacing what was there."""
    parent, name = posixpath.split(path)
    await call(api.put_archive, container_id, parent or "/", file_tar(name, data, mode))


def launch_target(argv: tuple[str, ...]) -> tuple[str, str]:
    """(what must exist where the launch runs, ``file`` for a script run by bash or ``exec``)."""
    if argv[0] == "bash" and len(argv) > 1 and not argv[1].startswith("-"):
        return argv[1], "file"
    return argv[0], "exec"


def check_command(argv: tuple[str, ...]) -> list[str]:
    target, kind = launch_target(argv)
    return ["bash", "-c", CHECK_SCRIPT, "sparkd-check", target, kind]


def target_sentence(argv: tuple[str, ...], status: int, where: str) -> str | None:
    """The sentence for CHECK_SCRIPT's exit ``status``; ``where`` is e.g. ``container vllm_ds4``."""
    target, _ = launch_target(argv)
    if status == 0:
        return None
    if status == 1:
        return f"the launch target {target} does not exist in {where}"
    if status == 2:
        return f"the launch target {target} is not executable in {where}"
    if status == 3:
        return f"the launch target {target} is not on PATH in {where}"
    return f"the launch target {target} could not be checked in {where} (check exited with {status})"


def no_bash(exc: BaseException) -> bool:
    text = explain(exc)
    return "executable file not found" in text or "no such file or directory" in text.lower()


# ---------------------------------------------------------------------------------------------------------
# Host PIDs


async def wait_same_exit(pid: int, create_time: float) -> None:
    """Return once the process ``pid`` created at ``create_time`` has exited (at once if it is gone).

    The pidfd is opened before the identity check, so a PID reused meanwhile cannot be mistaken for it.
    """
    if pid <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if proctree.same_process(pid, create_time) is None:
            return
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def create_time_or_zero(pid: int) -> float:
    """psutil's create_time of ``pid``, or 0.0 when it already ended (no live process matches 0.0)."""
    if pid <= 0:
        return 0.0
    try:
        return proctree.create_time(pid)
    except Exception:
        return 0.0


# ---------------------------------------------------------------------------------------------------------
# The shared base


class DockerRuntime(Runtime):
    """Shared state of the Docker runtimes.

    ``labels``: extra labels for every container this runtime creates (tests mark theirs for cleanup).
    ``client``: a ``docker.DockerClient`` to use; by default one from the environment, made on first use.
    """

    def __init__(
        self, cfg: Config, *, rehearse: bool = False, labels: Mapping[str, str] | None = None,
        client: Any = None,
    ) -> None:
        self.cfg = cfg
        self.rehearse = rehearse
        self.extra_labels = {**cfg.container.labels, **(labels or {})}
        self._client = client

    @property
    def container_name(self) -> str:
        return self.cfg.container.name

    @property
    def node(self) -> str:
        return self.cfg.node.name

    async def docker(self) -> Any:
        if self._client is None:
            self._client = await call(docker.from_env, timeout=API_TIMEOUT_S)
        return self._client

    def labels(self, **more: str) -> dict[str, str]:
        return {**self.extra_labels, MANAGED_LABEL: "1", NODE_LABEL: self.node, **more}

    def ours(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return labels.get(MANAGED_LABEL) == "1" and labels.get(NODE_LABEL) == self.node

    async def container(self, ref: str) -> Any | None:
        """The container ``ref`` (id or name), or None when there is none."""
        client = await self.docker()
        try:
            return await call(client.containers.get, ref)
        except docker.errors.NotFound:
            return None

    async def configured_image_id(self) -> str | None:
        """The local id of the configured image: the pair compares it across nodes."""
        try:
            client = await self.docker()
            image = await call(client.images.get, self.cfg.container.image)
        except Exception:  # no engine, no image: the launch itself reports that
            return None
        return str(image.id)

    async def inspect(self, instance: Instance) -> dict[str, Any] | None:
        """``docker inspect`` of the instance's container, for incident folders; None if unavailable."""
        if not instance.container_id:
            return None
        try:
            client = await self.docker()
            data: dict[str, Any] = await call(client.api.inspect_container, instance.container_id)
        except DOCKER_ERRORS:
            return None
        return data

    def pids(self, instance: Instance) -> set[int]:
        if instance.pid <= 0 or proctree.same_process(instance.pid, instance.create_time) is None:
            return set()
        return proctree.tree_pids(instance.pid)
