"""What the Docker runtimes share: the engine client, labels, the launch error template, the configured image,
``docker inspect``, host PID waits, and commands run in a short-lived container of the configured image.

A subclass says how a launch starts (``_launch``) and how a command reaches the place vLLM runs (``exec``);
this base turns engine errors during a launch into one ``LaunchError`` sentence for both, and makes any engine
error a wait (``unavailable``) when the engine takes no new connection: it is stopping or restarting.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import docker.errors
import requests

from sparkd.config import Config
from sparkd.launch.render import LaunchSpec
from sparkd.runtime import proctree
from sparkd.runtime.base import (
    EXEC_TIMEOUT_S,
    ExecResult,
    ImageIdentity,
    Instance,
    LaunchError,
    Runtime,
    TargetUnavailable,
    engine_unreachable,
)
from sparkd.runtime.container_spec import container_options, missing_devices
from sparkd.runtime.docker_api import (
    CHECK_LABEL,
    DOCKER_ERRORS,
    MANAGED_LABEL,
    NODE_LABEL,
    call,
    close_quietly,
    connect,
    decode,
    explain,
    no_bash,
)
from sparkd.runtime.drift import env_map

TIMED_OUT = 124  # the exit status of a command that ran out of time, as timeout(1) reports it
ENGINE_CHECK_S = 10.0  # a ping on a new connection: an engine that takes longer does not answer


def create_time_or_zero(pid: int) -> float:
    """psutil's create_time of ``pid``, or 0.0 when it already ended (no live process matches 0.0)."""
    if pid <= 0:
        return 0.0
    try:
        return proctree.create_time(pid)
    except Exception:
        return 0.0


class ImageMissing(TargetUnavailable):
    """The configured image is not on this node."""


def timed_out(timeout_s: float) -> ExecResult:
    return ExecResult(TIMED_OUT, "", f"timed out after {timeout_s:g} s")


class DockerRuntime(Runtime):
    """Shared state of the Docker runtimes.

    ``labels``: extra labels for every container this runtime creates (tests mark theirs for cleanup).
    ``client``: a ``docker.DockerClient`` to use; by default one from the environment, made on first use.
    """

    def __init__(
        self, cfg: Config, *, rehearse: bool = False, labels: Mapping[str, str] | None = None,
        client: Any = None,
    ) -> None:
        self.config: Callable[[], Config] = lambda: cfg  # until the daemon's loop holds the config in force
        self.rehearse = rehearse
        self.test_labels = dict(labels or {})
        self._client = client

    @classmethod
    def from_config(cls, cfg: Config, *, rehearse: bool = False) -> DockerRuntime:
        return cls(cfg, rehearse=rehearse)

    def follow(self, config: Callable[[], Config]) -> None:
        self.config = config

    @property
    def cfg(self) -> Config:
        return self.config()

    @property
    def extra_labels(self) -> dict[str, str]:
        """``[container] labels`` in force, and a test's own."""
        return {**self.cfg.container.labels, **self.test_labels}

    @property
    def container_name(self) -> str:
        return self.cfg.container.name

    @property
    def node(self) -> str:
        return self.cfg.node.name

    @property
    def shares_host_network(self) -> bool:
        return self.cfg.container.host_network

    @property
    def shares_host_ipc(self) -> bool:
        return self.cfg.container.host_ipc

    async def docker(self) -> Any:
        if self._client is None:
            self._client = await connect()
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

    # ---- launch: one error template

    async def launch(self, spec: LaunchSpec) -> Instance:
        try:
            return await self._launch(spec)
        except DOCKER_ERRORS as exc:
            error = LaunchError(f"{self.name} launch in container {self.container_name} failed: {explain(exc)}",
                                125, unavailable=engine_unreachable(exc))
            error.__cause__ = exc
        except LaunchError as exc:
            error = exc
        if not error.unavailable and isinstance(error.__cause__, DOCKER_ERRORS) and not await self.engine_answers():
            error.unavailable = True  # the engine's own error, from an engine on its way down: a wait as well
        raise error

    @abc.abstractmethod
    async def _launch(self, spec: LaunchSpec) -> Instance:
        """Start the launch; engine errors are turned into LaunchError by ``launch``."""

    # ---- what the engine knows

    async def engine_answers(self) -> bool:
        """A ping on a client of its own (a new connection), not on the pooled one ``docker()`` keeps."""
        try:
            fresh = await call(docker.from_env, timeout=ENGINE_CHECK_S)
        except DOCKER_ERRORS:
            return False
        try:
            return bool(await call(fresh.ping))
        except DOCKER_ERRORS:
            return False
        finally:
            close_quietly(fresh)

    async def image_attrs(self) -> dict[str, Any] | None:
        """``docker image inspect`` of the configured image, read now (a tag may have moved); None when the
        image is not on this node or the engine does not answer (the launch itself reports that)."""
        try:
            client = await self.docker()
            data: dict[str, Any] = await call(client.api.inspect_image, self.cfg.container.image)
        except DOCKER_ERRORS:
            return None
        return data

    async def image_identity(self) -> ImageIdentity | None:
        attrs = await self.image_attrs()
        if attrs is None:
            return None
        config = attrs.get("Config") or {}
        return ImageIdentity(id=str(attrs.get("Id", "")), repo_digests=tuple(attrs.get("RepoDigests") or ()),
                             labels=dict(config.get("Labels") or {}), env=env_map(config.get("Env")))

    def missing_devices(self) -> str | None:
        """A configured device that is not on this host, as a sentence; None when all are there."""
        missing = missing_devices(self.cfg)
        if not missing:
            return None
        return (f"the device {', '.join(missing)} in container.devices does not exist on this host (no RDMA "
                "driver loaded, or another path)")

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

    async def container_pid(self) -> int:
        try:
            container = await self.container(self.container_name)
        except DOCKER_ERRORS:
            return 0
        if container is None or container.status != "running":
            return 0
        return int(container.attrs.get("State", {}).get("Pid") or 0)

    def pids(self, instance: Instance) -> set[int]:
        if instance.pid <= 0 or proctree.same_process(instance.pid, instance.create_time) is None:
            return set()
        return proctree.tree_pids(instance.pid)

    # ---- a command in a short-lived container of the configured image

    async def run_once(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                       timeout_s: float = EXEC_TIMEOUT_S) -> ExecResult:
        """Run ``cmd`` in a new container of the configured image with the configured mounts (no GPU), removed
        after. A missing executable is exit 127, as a shell says. Raises TargetUnavailable."""
        image = self.cfg.container.image
        options = container_options(
            self.cfg, entrypoint=list(cmd), rehearse=self.rehearse, name=None, gpus=False, env=env,
            labels={**self.extra_labels, CHECK_LABEL: "1", NODE_LABEL: self.node},
        )
        try:
            client = await self.docker()
            container = await call(client.containers.create, **options)
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(f"the image {image} is not on this node (pull or build it)") from exc
        except DOCKER_ERRORS as exc:
            raise TargetUnavailable(f"cannot create a container of {image}: {explain(exc)}") from exc
        try:
            return await self._run_created(container, timeout_s)
        except DOCKER_ERRORS as exc:
            raise TargetUnavailable(f"cannot run a container of {image}: {explain(exc)}") from exc
        finally:
            with contextlib.suppress(*DOCKER_ERRORS):
                await call(container.remove, force=True, v=True)

    async def _run_created(self, container: Any, timeout_s: float) -> ExecResult:
        try:
            await call(container.start)
        except docker.errors.APIError as exc:
            if no_bash(exc):
                return ExecResult(127, "", explain(exc))
            raise
        try:
            status = await call(container.wait, timeout=timeout_s)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):  # the wait's timeout
            return timed_out(timeout_s)
        out = await call(container.logs, stdout=True, stderr=False)
        err = await call(container.logs, stdout=False, stderr=True)
        return ExecResult(int(status["StatusCode"]), decode(out), decode(err))
