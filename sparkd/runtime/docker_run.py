"""A fresh container per launch whose main process is vLLM (``docker run``).

Each launch removes the previous stopped container of ours with the configured name, creates a new one
(labels ``sparkd.managed``, ``sparkd.node``, ``sparkd.config_hash``) whose entrypoint is ``bash SCRIPT``,
puts the rendered script in and starts it: bash execs the script, which execs vLLM as the container's PID 1.
Exits come from the engine's ``die`` events (edges), checked against ``inspect`` (the level); the events
stream is reopened with ``since=`` when it breaks. Stop is ``docker kill`` SIGTERM, grace, SIGKILL; the
stopped container is kept as evidence until the next launch. Output comes from ``docker logs``.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import anyio
import docker.errors

from sparkd.host.waits import Flag
from sparkd.launch.probe import probe_dir
from sparkd.launch.render import LaunchSpec, render_script
from sparkd.runtime.base import EXEC_TIMEOUT_S, ExecResult, ExitInfo, Instance, LaunchError, TargetUnavailable
from sparkd.runtime.container_spec import compile_cache_mounts, container_options
from sparkd.runtime.docker_api import (
    CHECK_LABEL,
    DOCKER_ERRORS,
    HASH_LABEL,
    MANAGED_LABEL,
    NODE_LABEL,
    call,
    close_quietly,
    create_stopping_after,
    epoch_param,
    explain,
    next_item,
    no_bash,
    put_file,
)
from sparkd.runtime.docker_base import DockerRuntime, ImageMissing, create_time_or_zero
from sparkd.runtime.launch_target import check_command, target_sentence
from sparkd.runtime.probedir import prepare
from sparkd.supervisor.graces import container_stop_timeout_s

RECONNECT_S = 1.0  # pause before reopening a broken events or logs stream
SETTLE_S = 10.0  # how long inspect may lag behind a die event
DRAIN_S = 5.0  # how long the log stream may run on after the exit
SEEN_WINDOW_NS = 2_000_000_000  # how far out of order stdout and stderr frames may arrive
CHECK_TIMEOUT_S = 120.0

_SPLIT = re.compile(r"\r\n|\r|\n")
# docker logs --timestamps: RFC 3339 with nanoseconds, then one space, before every message.
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


def split_stamp(frame: bytes) -> tuple[int | None, bytes]:
    """(nanoseconds since the epoch, message) of one ``docker logs --timestamps`` frame."""
    match = _STAMP.match(frame)
    if match is None:
        return None, frame
    zone = match.group(3).decode().replace("Z", "+00:00")
    seconds = int(datetime.fromisoformat(match.group(1).decode() + zone).timestamp())
    fraction = (match.group(2) or b"0").decode().ljust(9, "0")
    return seconds * 1_000_000_000 + int(fraction), frame[match.end():]


def exit_from_state(state: dict[str, Any]) -> ExitInfo:
    code = state.get("ExitCode")
    return ExitInfo(exit_code=None) if code is None else ExitInfo.from_returncode(int(code))


class _Lines:
    """Splits ``docker logs --timestamps`` frames into lines, skipping frames already seen.

    stdout and stderr are merged by the engine, so stamps are only nearly in order: the stamps of the last
    ``SEEN_WINDOW_NS`` are remembered, and a reopened stream starts that far back.
    """

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.newest_ns = 0
        self.seen: set[int] = set()
        self.order: deque[int] = deque()

    @property
    def since_s(self) -> int | None:
        """``since=`` for reopening the stream: None for the start, else seconds before the newest frame."""
        return (self.newest_ns - SEEN_WINDOW_NS) // 1_000_000_000 if self.newest_ns else None

    def feed(self, frame: bytes) -> list[str]:
        stamp, message = split_stamp(frame)
        if stamp is not None:
            if stamp in self.seen or stamp < self.newest_ns - SEEN_WINDOW_NS:
                return []  # read before the stream was reopened
            self.seen.add(stamp)
            self.order.append(stamp)
            self.newest_ns = max(self.newest_ns, stamp)
            while self.order and self.order[0] < self.newest_ns - SEEN_WINDOW_NS:
                self.seen.discard(self.order.popleft())
        self.pending += self.decoder.decode(message)
        *lines, self.pending = _SPLIT.split(self.pending)
        return lines

    def end(self) -> list[str]:
        rest, self.pending = self.pending + self.decoder.decode(b"", final=True), ""
        return [rest] if rest else []


class DockerRunRuntime(DockerRuntime):
    name = "docker-run"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exits: dict[str, ExitInfo] = {}
        self._inspected: dict[str, dict[str, Any]] = {}

    # ---- launch

    async def _launch(self, spec: LaunchSpec) -> Instance:
        await self._remove_previous()
        folder = probe_dir(self.cfg)  # the container's mounts come from the config: so does the folder they need
        prepare(str(folder) if folder else None, user=self.cfg.container.user)
        cfg, client = self.cfg, await self.docker()
        script_path = cfg.container.script_path
        options = container_options(
            cfg, entrypoint=["bash", script_path], labels=self.labels(**{HASH_LABEL: spec.config_hash}),
            rehearse=self.rehearse, name=self.container_name, env=spec.secret_env,
        )
        caches = compile_cache_mounts(cfg)  # a new container each launch: its compile caches must outlive it
        for mount in caches:
            try:
                await anyio.Path(mount["Source"]).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LaunchError(f"cannot make the compile cache directory {mount['Source']} ([container] "
                                  f"compile_cache_dir): {exc.strerror}; set another one, or false", 126) from exc
        options["mounts"] = [*options["mounts"], *caches]
        try:
            # vLLM is the container's main process: whoever stops the container (`docker stop` without -t, the
            # engine's own shutdown) must let it drain as long as sparkd would.
            container = await call(create_stopping_after, client, container_stop_timeout_s(cfg), **options)
        except docker.errors.ImageNotFound as exc:
            raise LaunchError(f"the image {cfg.container.image} is not on this node (pull or build it)",
                              127) from exc
        await put_file(client.api, container.id, script_path, render_script(spec).encode(), 0o755)
        try:
            await call(container.start)
        except docker.errors.APIError as exc:  # the container stays, as evidence, until the next launch
            code = 127 if no_bash(exc) else 125
            raise LaunchError(f"container {self.container_name} does not start: {explain(exc)}", code) from exc
        await call(container.reload)
        pid = int(container.attrs["State"].get("Pid") or 0)  # 0: it already ended; wait() reports how
        return Instance(
            runtime=self.name, pid=pid, create_time=create_time_or_zero(pid), config_hash=spec.config_hash,
            container_id=container.id, extra={"container": self.container_name},
        )

    async def _remove_previous(self) -> None:
        """Remove the stopped container of our previous launch; refuse to touch anything else."""
        name = self.container_name
        old = await self.container(name)
        if old is None:
            return
        if not self.ours(old.labels) or old.labels.get(CHECK_LABEL):
            raise LaunchError(
                f"a container named {name} exists that sparkd did not launch on node {self.node}; "
                f"remove or rename it, or set another [container] name", 127)
        if old.status in ("running", "restarting", "paused"):
            raise LaunchError(f"container {name} of an earlier launch is still {old.status}; stop it first", 125)
        with contextlib.suppress(docker.errors.NotFound):
            await call(old.remove, v=True)

    # ---- where vLLM runs: a fresh container of the image, per launch

    @property
    def where(self) -> str:
        return f"in image {self.cfg.container.image}"

    async def exec(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout_s: float = EXEC_TIMEOUT_S) -> ExecResult:
        """The command in a short-lived container of the configured image with the configured mounts."""
        return await self.run_once(cmd, env=env, timeout_s=timeout_s)

    async def missing_target(self, spec: LaunchSpec) -> str | None:
        """Check the launch target in a short-lived container of the configured image, with the mounts."""
        missing = self.missing_devices()
        if missing:
            return missing
        try:
            result = await self.exec(check_command(spec.argv), env=spec.env, timeout_s=CHECK_TIMEOUT_S)
        except ImageMissing as exc:
            return str(exc)
        except TargetUnavailable:
            return None  # the engine's trouble: the launch reports it
        if result.exit_code in (126, 127):
            return f"bash is not {self.where} (sparkd launches through bash)"
        return target_sentence(spec.argv, result.exit_code, self.where)

    async def recreate(self) -> str:
        """Each launch creates a fresh container; this removes the stopped one kept from the last launch."""
        name = self.container_name
        try:
            old = await self.container(name)
            if old is None:
                return f"no container {name} is kept; the next launch creates a fresh one"
            await self._remove_previous()
        except DOCKER_ERRORS as exc:
            raise LaunchError(f"cannot remove container {name}: {explain(exc)}", 125) from exc
        return f"removed the stopped container {name} of the last launch; the next launch creates a fresh one"

    # ---- adoption

    async def find(self, record: dict[str, Any] | None) -> Instance | None:
        """The running container of the record; without one, a running container labelled ours."""
        if record and record.get("runtime") == self.name and record.get("container_id"):
            return await self._adopt(str(record["container_id"]))
        client = await self.docker()
        running = await call(client.containers.list, filters={
            "label": [f"{MANAGED_LABEL}=1", f"{NODE_LABEL}={self.node}"], "status": "running"})
        # Only our launches carry the config hash: a docker-exec container of the same node (its main process
        # is `sleep infinity`, not vLLM) or a target-check container is never adopted.
        running = [c for c in running if self.ours(c.labels) and not c.labels.get(CHECK_LABEL)
                   and HASH_LABEL in c.labels]
        if not running:
            return None
        newest = max(running, key=lambda c: c.attrs.get("Created", ""))
        return await self._adopt(newest.id)

    async def _adopt(self, container_id: str) -> Instance | None:
        container = await self.container(container_id)
        if container is None or container.status != "running" or not self.ours(container.labels) \
                or HASH_LABEL not in container.labels:
            return None
        pid = int(container.attrs["State"].get("Pid") or 0)
        return Instance(
            runtime=self.name, pid=pid, create_time=create_time_or_zero(pid),
            config_hash=container.labels.get(HASH_LABEL, ""), container_id=container.id,
            extra={"container": container.name},
        )

    # ---- exit

    def last_inspect(self, instance: Instance) -> dict[str, Any] | None:
        """The inspect data seen when ``wait`` observed the exit (``State.OOMKilled``, ``ExitCode``, ...)."""
        return self._inspected.get(instance.container_id or "")

    async def wait(self, instance: Instance) -> ExitInfo:
        cid = str(instance.container_id)
        if cid in self._exits:
            return self._exits[cid]
        since_ns = time.time_ns() - 1_000_000_000  # events from before the first inspect: no gap
        while True:
            data = await self._inspect_retrying(cid)
            if data is None:
                info = ExitInfo(exit_code=None)  # removed under us: nothing tells how it ended
                break
            state = data.get("State") or {}
            if not state.get("Running") or (instance.pid and state.get("Pid") != instance.pid):
                self._inspected[cid] = data
                info = exit_from_state(state) if not state.get("Running") else ExitInfo(exit_code=None)
                break
            event = await self._next_die(cid, since_ns)
            if event is None:
                await anyio.sleep(RECONNECT_S)
                continue
            since_ns = int(event.get("timeNano") or time.time_ns()) + 1
            await self._settle(cid)
        self._exits[cid] = info
        return info

    async def _inspect_retrying(self, cid: str) -> dict[str, Any] | None:
        """``inspect`` of ``cid``; None when it is gone. Waits out an engine that does not answer."""
        while True:
            try:
                client = await self.docker()
                data: dict[str, Any] = await call(client.api.inspect_container, cid)
                return data
            except docker.errors.NotFound:
                return None
            except DOCKER_ERRORS:
                await anyio.sleep(RECONNECT_S)

    async def _next_die(self, cid: str, since_ns: int) -> dict[str, Any] | None:
        """The first ``die`` event of ``cid`` since ``since_ns``; None when the stream broke first."""
        try:
            api = (await self.docker()).api
            stream = await call(api.events, since=epoch_param(since_ns), decode=True,
                                filters={"type": "container", "container": cid, "event": "die"})
        except DOCKER_ERRORS:
            return None
        try:
            event: dict[str, Any] | None = await next_item(stream)
            return event
        finally:
            close_quietly(stream)

    async def _settle(self, cid: str) -> None:
        """After a die event, give inspect a moment to agree."""
        with anyio.move_on_after(SETTLE_S):
            while True:
                data = await self._inspect_retrying(cid)
                if data is None or not (data.get("State") or {}).get("Running"):
                    return
                await anyio.sleep(0.05)

    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        """``docker kill`` SIGTERM, wait up to ``grace_s``, SIGKILL, wait. The container is kept."""
        await self._kill(instance, signal.SIGTERM)
        with anyio.move_on_after(grace_s):
            return await self.wait(instance)
        await self._kill(instance, signal.SIGKILL)
        return replace(await self.wait(instance), killed=(instance.pid,))

    async def _kill(self, instance: Instance, sig: int) -> None:
        with contextlib.suppress(docker.errors.APIError):  # not running any more, or gone
            await call((await self.docker()).api.kill, instance.container_id, signal=int(sig))

    # ---- output

    async def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
        """The container's stdout and stderr lines from its start; ends after the container stopped.

        A broken stream is reopened where it stopped. Docker may end a followed stream before it has
        stored the last, unterminated message, so once the exit is known (``done``) the tail is read again.
        """
        cid = str(instance.container_id)
        lines = _Lines()
        follow = True
        while True:
            stream = await self._open_logs(cid, lines.since_s, follow=follow)
            if stream is not None:
                try:
                    while (frame := await self._next_frame(stream, done)) is not None:
                        for line in lines.feed(frame):
                            yield line
                finally:
                    close_quietly(stream)
            if not follow:
                break
            if not done.is_set() and await self._running(cid):
                await anyio.sleep(RECONNECT_S)
                continue
            with anyio.move_on_after(DRAIN_S):
                await done.wait()
            follow = False  # one last read of what is stored
        for line in lines.end():
            yield line

    async def _open_logs(self, cid: str, since_s: int | None, *, follow: bool) -> Any | None:
        try:
            api = (await self.docker()).api
            return await call(api.logs, cid, stdout=True, stderr=True, stream=True, follow=follow,
                              timestamps=True, since=since_s or None)
        except DOCKER_ERRORS:
            return None

    async def _next_frame(self, stream: Any, done: Flag) -> bytes | None:
        """The next frame, or None at the stream's end or ``DRAIN_S`` after ``done`` was set."""
        frame: bytes | None = None
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                nonlocal frame
                frame = await next_item(stream)
                tg.cancel_scope.cancel()

            async def deadline() -> None:
                await done.wait()
                await anyio.sleep(DRAIN_S)
                tg.cancel_scope.cancel()

            tg.start_soon(read)
            tg.start_soon(deadline)
        return frame

    async def _running(self, cid: str) -> bool:
        try:
            data = await call((await self.docker()).api.inspect_container, cid)
        except DOCKER_ERRORS:
            return False
        return bool((data.get("State") or {}).get("Running"))


RUNTIME = DockerRunRuntime  # what sparkd.runtime.runtime_class finds for this kind
