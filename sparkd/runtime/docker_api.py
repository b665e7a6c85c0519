"""The Docker SDK, used from async code: every blocking call in a worker thread, streams read one item per
thread hop, engine errors in the engine's own words, and files put into containers.

Streams are closed by the caller, which ends an abandoned read when the caller is cancelled.
"""

from __future__ import annotations

import contextlib
import functools
import io
import posixpath
import tarfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import docker
import docker.errors
import requests
import urllib3

MANAGED_LABEL = "sparkd.managed"
NODE_LABEL = "sparkd.node"
HASH_LABEL = "sparkd.config_hash"
CHECK_LABEL = "sparkd.check"  # short-lived containers that run a command for preflight (never adopted)

API_TIMEOUT_S = 120.0
DOCKER_ERRORS: tuple[type[Exception], ...] = (docker.errors.DockerException, requests.RequestException)
_STREAM_ERRORS: tuple[type[Exception], ...] = (
    *DOCKER_ERRORS, urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError,
)

T = TypeVar("T")


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one blocking Docker SDK call in a worker thread."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def create_stopping_after(client: Any, stop_timeout: int, **options: Any) -> Any:
    """``client.containers.create(**options)`` with the container's own stop timeout (``docker create
    --stop-timeout``), which the SDK's high-level create does not take (docker 7.2): its own translation of the
    keywords, then the engine's create with ``stop_timeout``. Blocking."""
    from docker.models.containers import _create_container_args

    created = client.api.create_container(**_create_container_args({**options, "version": client.api._version}),
                                          stop_timeout=stop_timeout)
    return client.containers.get(created["Id"])


async def connect() -> Any:
    """A ``docker.DockerClient`` from the environment (DOCKER_HOST or the local socket)."""
    return await call(docker.from_env, timeout=API_TIMEOUT_S)


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


def no_bash(exc: BaseException) -> bool:
    """The engine could not start bash in the container (the image has none)."""
    text = explain(exc)
    return "executable file not found" in text or "no such file or directory" in text.lower()


def epoch_param(ns: int) -> str:
    """A ``since=`` value for the events API with nanosecond precision."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def decode(data: bytes | None) -> str:
    return bytes(data or b"").decode("utf-8", errors="replace")


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
