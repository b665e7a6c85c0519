"""Where in-container checks run: a command executed where vLLM will run, returning (exit code, stdout).

The model path and the image assertions must be checked where vLLM runs: on the host for the process runtime,
inside the container for the Docker runtimes. A runtime that implements ``exec_in_container(cmd)`` is used as
is. Until the Docker runtimes do, preflight brings its own small adapters built on the engine API:

- docker-exec: ``docker exec`` in the configured container (it must be running; the launch-target check,
  which runs first, creates or starts it);
- docker-run: a short-lived container of the configured image with the configured mounts, removed after;
- process: the command on the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio
import docker
import docker.errors

from sparkd.config import Config, RuntimeKind
from sparkd.runtime.dockerutil import API_TIMEOUT_S, CHECK_LABEL, DOCKER_ERRORS, NODE_LABEL, call, container_options

RUN_TIMEOUT_S = 60.0


class ContainerUnavailable(Exception):
    """There is nothing to run the command in (the container is missing or stopped, the engine is down)."""


@runtime_checkable
class ContainerExec(Protocol):
    async def exec_in_container(self, cmd: Sequence[str]) -> tuple[int, str]:
        """Run ``cmd`` where vLLM runs; (exit code, stdout). Raises ContainerUnavailable."""
        ...


def where(cfg: Config) -> str:
    if cfg.runtime is RuntimeKind.docker_exec:
        return f"in container {cfg.container.name}"
    if cfg.runtime is RuntimeKind.docker_run:
        return f"in image {cfg.container.image}"
    return "on this host"


class HostExec:
    async def exec_in_container(self, cmd: Sequence[str]) -> tuple[int, str]:
        with anyio.fail_after(RUN_TIMEOUT_S):
            result = await anyio.run_process(list(cmd), check=False, stderr=None)
        return result.returncode, result.stdout.decode("utf-8", errors="replace")


class _Docker:
    def __init__(self, cfg: Config, client: Any = None) -> None:
        self.cfg = cfg
        self._client = client

    async def client(self) -> Any:
        if self._client is None:
            try:
                self._client = await call(docker.from_env, timeout=API_TIMEOUT_S)
            except DOCKER_ERRORS as exc:
                raise ContainerUnavailable(f"the Docker engine does not answer: {exc}") from exc
        return self._client


class DockerExecIn(_Docker):
    """``docker exec`` in the configured (running) container."""

    async def status(self) -> str | None:
        """The container's status (``running``, ``exited``, ...); None when there is no such container."""
        try:
            container = await call((await self.client()).containers.get, self.cfg.container.name)
        except docker.errors.NotFound:
            return None
        except DOCKER_ERRORS as exc:
            raise ContainerUnavailable(f"the Docker engine does not answer: {exc}") from exc
        return str(container.status)

    async def exec_in_container(self, cmd: Sequence[str]) -> tuple[int, str]:
        name = self.cfg.container.name
        try:
            container = await call((await self.client()).containers.get, name)
            if container.status != "running":
                raise ContainerUnavailable(f"container {name} is {container.status}")
            result = await call(container.exec_run, list(cmd), stdout=True, stderr=False)
        except docker.errors.NotFound as exc:
            raise ContainerUnavailable(f"container {name} does not exist") from exc
        except DOCKER_ERRORS as exc:
            raise ContainerUnavailable(f"cannot exec in container {name}: {exc}") from exc
        return int(result.exit_code), bytes(result.output or b"").decode("utf-8", errors="replace")


class DockerRunIn(_Docker):
    """A short-lived container of the configured image with the configured mounts."""

    def __init__(self, cfg: Config, client: Any = None, labels: Mapping[str, str] | None = None) -> None:
        super().__init__(cfg, client)
        self.labels = dict(labels or {})

    async def exec_in_container(self, cmd: Sequence[str]) -> tuple[int, str]:
        client = await self.client()
        options = container_options(
            self.cfg, entrypoint=list(cmd), rehearse=False, name=None, gpus=False,
            labels={**self.labels, CHECK_LABEL: "1", NODE_LABEL: self.cfg.node.name},
        )
        try:
            container = await call(client.containers.create, **options)
        except docker.errors.ImageNotFound as exc:
            raise ContainerUnavailable(f"the image {self.cfg.container.image} is not on this node") from exc
        except DOCKER_ERRORS as exc:
            raise ContainerUnavailable(f"cannot create a container of {self.cfg.container.image}: {exc}") from exc
        try:
            await call(container.start)
            status = await call(container.wait, timeout=RUN_TIMEOUT_S)
            output = await call(container.logs, stdout=True, stderr=False)
            return int(status["StatusCode"]), bytes(output).decode("utf-8", errors="replace")
        except DOCKER_ERRORS as exc:
            raise ContainerUnavailable(f"cannot run a container of {self.cfg.container.image}: {exc}") from exc
        finally:
            await call(container.remove, force=True, v=True)


def resolve(cfg: Config, runtime: object, given: ContainerExec | None = None) -> ContainerExec:
    """The given one, else the runtime when it implements the protocol, else preflight's own adapter."""
    if given is not None:
        return given
    if isinstance(runtime, ContainerExec):
        return runtime
    if cfg.runtime is RuntimeKind.docker_exec:
        return DockerExecIn(cfg)
    if cfg.runtime is RuntimeKind.docker_run:
        return DockerRunIn(cfg, labels=getattr(runtime, "extra_labels", None))
    return HostExec()
