"""vLLM exec'd into a long-lived container, the way the community runs it (``docker exec``).

The container (``[container] name``) is created when missing and started when stopped; its main process is
``[container] command`` (``sleep infinity``). Each launch puts the rendered script into it and execs
``bash -c ": > LOG; exec bash SCRIPT >> LOG 2>&1"``: bash execs the script, which execs vLLM, so the exec's
host PID (from ``exec_inspect``) is vLLM's. Docker cannot signal an exec, so stop works on that host PID
tree; exits are seen through a pidfd and the exit status comes from ``exec_inspect``. The output file is
read from the host through ``/proc/<container init PID>/root``, resolved inside the container
(:mod:`sparkd.runtime.inroot`: a link there never leads out of it), so an instance outlives a daemon restart.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import docker.errors

from sparkd.host.waits import Flag
from sparkd.launch.probe import probe_dir
from sparkd.launch.render import LaunchSpec, render_script
from sparkd.runtime import proctree
from sparkd.runtime.base import (
    EXEC_TIMEOUT_S,
    Difference,
    ExecResult,
    ExitInfo,
    Instance,
    LaunchError,
    TargetUnavailable,
)
from sparkd.runtime.container_spec import container_options, missing_rehearse_mounts
from sparkd.runtime.docker_api import DOCKER_ERRORS, call, decode, explain, no_bash, put_file, short_id
from sparkd.runtime.docker_base import DockerRuntime, create_time_or_zero, timed_out
from sparkd.runtime.drift import container_drift
from sparkd.runtime.inroot import open_log
from sparkd.runtime.launch_target import check_command, target_sentence
from sparkd.runtime.logfile import follow_file
from sparkd.runtime.probedir import prepare

LOG_IN_CONTAINER = "/tmp/sparkd-vllm.log"
RAW_LOG_LIMIT = 8 * 1024 * 1024
EXEC_MARK = "sparkd-launch"  # $0 of the exec's bash: marks our execs so one is found even without a record
PID_WAIT_S = 10.0
EXIT_WAIT_S = 10.0


def exec_command(script_path: str, config_hash: str) -> list[str]:
    log, script = shlex.quote(LOG_IN_CONTAINER), shlex.quote(script_path)
    return ["bash", "-c", f": > {log}; exec bash {script} >> {log} 2>&1", EXEC_MARK, config_hash]


def host_log_path(init_pid: int) -> str:
    """Where the host reads the container's output file: through the container init's root."""
    return f"/proc/{init_pid}/root{LOG_IN_CONTAINER}"


def is_our_exec(data: dict[str, Any]) -> bool:
    process = data.get("ProcessConfig") or {}
    args = process.get("arguments") or []
    return (process.get("entrypoint") == "bash" and len(args) >= 3 and args[0] == "-c"
            and args[2] == EXEC_MARK and LOG_IN_CONTAINER in args[1])


class DockerExecRuntime(DockerRuntime):
    name = "docker-exec"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exits: dict[str, ExitInfo] = {}

    # ---- the container

    async def ensure_container(self) -> Any:
        """The configured container, running: created when missing, started when stopped."""
        name = self.container_name
        container = await self.container(name)
        if container is None:
            container = await self._create()
        status = container.status
        if status in ("paused", "removing", "dead"):
            raise LaunchError(f"container {name} is {status}; sparkd cannot exec into it", 125)
        if status != "running":
            try:
                await call(container.start)
            except docker.errors.APIError as exc:
                raise LaunchError(f"container {name} does not start: {explain(exc)}", 125) from exc
            await call(container.reload)
            if container.status != "running":
                state = container.attrs.get("State") or {}
                raise LaunchError(
                    f"container {name} stopped right after starting (exit code {state.get('ExitCode')}): "
                    f"its command {container.attrs['Config'].get('Entrypoint')} must keep running", 125)
        if self.rehearse:
            missing = missing_rehearse_mounts(container.attrs)
            if missing:
                raise LaunchError(
                    f"container {name} lacks the read-only mounts {', '.join(missing)} that a rehearsal needs "
                    "(the host's Python and sparkd run inside it); remove the container so sparkd recreates "
                    "it with them, or add them to [container] mounts", 127)
        return container

    async def _create(self) -> Any:
        cfg, client = self.cfg, await self.docker()
        folder = probe_dir(cfg)
        prepare(str(folder) if folder else None, user=cfg.container.user)  # a bind mount needs its source
        options = container_options(
            cfg, entrypoint=list(cfg.container.command), labels=self.labels(), rehearse=self.rehearse,
            name=self.container_name,
        )
        try:
            return await call(client.containers.create, **options)
        except docker.errors.ImageNotFound as exc:
            raise LaunchError(
                f"the image {cfg.container.image} of container {self.container_name} is not on this node "
                "(pull or build it)", 127) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # created meanwhile by someone else: use it
                return await call(client.containers.get, self.container_name)
            raise LaunchError(f"cannot create container {self.container_name}: {explain(exc)}", 125) from exc

    # ---- launch

    async def _launch(self, spec: LaunchSpec) -> Instance:
        folder = probe_dir(self.cfg)  # the container's mounts come from the config: so does the folder they need
        prepare(str(folder) if folder else None, user=self.cfg.container.user)
        container = await self.ensure_container()
        running = await self._scan_execs()
        if running is not None:  # at most one vLLM per node: the daemon adopts it instead
            raise LaunchError(f"an earlier launch still runs in container {self.container_name} "
                              f"(host PID {running.pid}); stop it first", 125)
        api = (await self.docker()).api
        script_path = self.cfg.container.script_path
        try:
            await put_file(api, container.id, script_path, render_script(spec).encode(), 0o755)
            await put_file(api, container.id, LOG_IN_CONTAINER, b"", 0o666)
        except docker.errors.NotFound as exc:
            raise LaunchError(f"cannot write {script_path} in container {self.container_name}: "
                              f"{explain(exc)}", 127) from exc
        exec_id = (await call(api.exec_create, container.id, exec_command(script_path, spec.config_hash),
                              stdout=False, stderr=False, environment=dict(spec.secret_env) or None))["Id"]
        try:
            await call(api.exec_start, exec_id, detach=True)
        except docker.errors.APIError as exc:
            if no_bash(exc):
                raise LaunchError(f"bash is not in container {self.container_name}: {explain(exc)}",
                                  127) from exc
            raise
        pid = await self._exec_pid(api, exec_id)
        return Instance(
            runtime=self.name, pid=pid, create_time=create_time_or_zero(pid), config_hash=spec.config_hash,
            container_id=container.id, exec_id=exec_id,
            log_path=host_log_path(container.attrs["State"]["Pid"]),
            extra={"container": self.container_name, "log_in_container": LOG_IN_CONTAINER},
        )

    async def _exec_pid(self, api: Any, exec_id: str) -> int:
        """The exec's host PID. An exec that already ended keeps its PID in exec_inspect: the Instance is
        still returned (its create_time is 0.0), and ``wait`` reports the exec's exit status."""
        with anyio.move_on_after(PID_WAIT_S):
            while True:
                data = await call(api.exec_inspect, exec_id)
                if data.get("Pid"):
                    return int(data["Pid"])
                if not data.get("Running") and data.get("ExitCode") is not None:
                    self._exits[exec_id] = ExitInfo.from_returncode(int(data["ExitCode"]))
                    return 0
                await anyio.sleep(0.02)
        raise LaunchError(f"the exec in container {self.container_name} reported no PID "
                          f"within {PID_WAIT_S:.0f} s", 125)

    # ---- where vLLM runs: the container

    @property
    def where(self) -> str:
        return f"in container {self.container_name}"

    async def pending_preparation(self) -> str | None:
        """The container is missing or stopped: the launch (and the target check) would create or start it."""
        try:
            container = await self.container(self.container_name)
        except DOCKER_ERRORS as exc:
            return f"the Docker engine does not answer: {explain(exc)}"
        if container is None:
            return (f"container {self.container_name} does not exist; the launch would create it from "
                    f"{self.cfg.container.image}")
        if container.status != "running":
            return f"container {self.container_name} is {container.status}; the launch would start it"
        return None

    async def exec(self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout_s: float = EXEC_TIMEOUT_S) -> ExecResult:
        """``docker exec`` in the running container; past ``timeout_s`` the exec's process is killed (124)."""
        name = self.container_name
        try:
            container = await self.container(name)
            if container is None:
                raise TargetUnavailable(f"container {name} does not exist")
            if container.status != "running":
                raise TargetUnavailable(f"container {name} is {container.status}")
            api = (await self.docker()).api
            exec_id = (await call(api.exec_create, container.id, list(cmd), environment=dict(env or {}) or None,
                                  stdout=True, stderr=True))["Id"]
            output = None
            with anyio.move_on_after(timeout_s):
                output = await anyio.to_thread.run_sync(
                    lambda: api.exec_start(exec_id, demux=True), abandon_on_cancel=True)
            if output is None:
                await self._kill_exec(api, exec_id)
                return timed_out(timeout_s)
            code = await self._exit_code(api, exec_id)
        except docker.errors.APIError as exc:
            if no_bash(exc):
                return ExecResult(127, "", explain(exc))
            raise TargetUnavailable(f"cannot exec in container {name}: {explain(exc)}") from exc
        except DOCKER_ERRORS as exc:
            raise TargetUnavailable(f"cannot exec in container {name}: {explain(exc)}") from exc
        out, err = decode(output[0]), decode(output[1])
        if code == 126 and out.startswith("OCI runtime exec failed") and "not found" in out:
            return ExecResult(127, "", out.strip())  # the engine's word for "command not found"
        return ExecResult(code, out, err)

    @staticmethod
    async def _exit_code(api: Any, exec_id: str) -> int:
        """The ended exec's status; Docker records it a moment after the output stream closes."""
        with anyio.move_on_after(EXIT_WAIT_S):
            while True:
                data = await call(api.exec_inspect, exec_id)
                if not data.get("Running") and data.get("ExitCode") is not None:
                    return int(data["ExitCode"])
                await anyio.sleep(0.02)
        raise TargetUnavailable(f"exec {exec_id[:12]} reported no exit status within {EXIT_WAIT_S:.0f} s")

    async def _kill_exec(self, api: Any, exec_id: str) -> None:
        data = await call(api.exec_inspect, exec_id)
        pid = int(data.get("Pid") or 0)
        if data.get("Running") and pid > 0:
            await proctree.terminate_tree(pid, 0)

    async def missing_target(self, spec: LaunchSpec) -> str | None:
        """What keeps the launch from running in the container: a missing target or mount, another image.

        Creates or starts the container when needed. Engine errors return None: the launch reports them.
        """
        missing = self.missing_devices()
        if missing:
            return missing
        try:
            await self.ensure_container()
            result = await self.exec(check_command(spec.argv), env=spec.env)
        except LaunchError as exc:
            return str(exc) if exc.exit_code in (126, 127) else None
        except TargetUnavailable:
            return None
        except DOCKER_ERRORS:
            return None
        if result.exit_code in (126, 127):
            return f"bash is not {self.where} (sparkd launches through bash)"
        return target_sentence(spec.argv, result.exit_code, self.where)

    # ---- the container against the config

    async def drift(self) -> list[Difference]:
        """How the existing container differs from ``[container]``, key by key; [] when there is none yet (the
        launch creates it from the config) or the engine does not answer."""
        try:
            container = await self.container(self.container_name)
        except DOCKER_ERRORS:
            return []
        if container is None:
            return []
        return container_drift(self.cfg, container.attrs, await self.image_attrs())

    async def recreate(self) -> str:
        """Remove the container (whoever made it) and create it again from the config, started. Refused while
        a launch of ours runs in it."""
        name = self.container_name
        try:
            running = await self._scan_execs()
            if running is not None:
                raise LaunchError(f"vLLM still runs in container {name} (host PID {running.pid}); stop it first",
                                  125)
            old = await self.container(name)
            if old is not None:
                await call(old.remove, force=True, v=False)
            container = await self.ensure_container()
        except DOCKER_ERRORS as exc:
            raise LaunchError(f"cannot recreate container {name}: {explain(exc)}", 125) from exc
        was = f"removed container {name} ({short_id(old.attrs.get('Image', ''))})" if old else \
            f"container {name} did not exist"
        return f"{was}; created it from the config ({self.cfg.container.image}, {short_id(container.id)})"

    # ---- watching

    async def find(self, record: dict[str, Any] | None) -> Instance | None:
        """The instance in ``record`` if its container runs and its PID is still that process; without a
        usable record, a running exec of ours in the configured container."""
        if record and record.get("runtime") == self.name and record.get("container_id"):
            found = await self._from_record(Instance.from_record(record))
            if found is not None:
                return found
        return await self._scan_execs()

    async def _from_record(self, instance: Instance) -> Instance | None:
        container = await self.container(str(instance.container_id))
        if container is None or container.status != "running":
            return None
        if proctree.same_process(instance.pid, instance.create_time) is None:
            return None
        return replace(instance, log_path=host_log_path(container.attrs["State"]["Pid"]))

    async def _scan_execs(self) -> Instance | None:
        container = await self.container(self.container_name)
        if container is None or container.status != "running":
            return None
        api = (await self.docker()).api
        for exec_id in container.attrs.get("ExecIDs") or []:
            try:
                data = await call(api.exec_inspect, exec_id)
            except docker.errors.NotFound:
                continue
            if not data.get("Running") or not is_our_exec(data) or not data.get("Pid"):
                continue
            pid = int(data["Pid"])
            args = data["ProcessConfig"]["arguments"]
            return Instance(
                runtime=self.name, pid=pid, create_time=create_time_or_zero(pid),
                config_hash=args[3] if len(args) > 3 else "", container_id=container.id, exec_id=exec_id,
                log_path=host_log_path(container.attrs["State"]["Pid"]),
                extra={"container": self.container_name, "log_in_container": LOG_IN_CONTAINER},
            )
        return None

    async def wait(self, instance: Instance) -> ExitInfo:
        key = instance.exec_id or f"pid:{instance.pid}"
        if key in self._exits:
            return self._exits[key]
        await proctree.wait_exit(instance.pid, instance.create_time)
        info = await self._exec_exit(instance.exec_id)
        self._exits[key] = info
        return info

    async def _exec_exit(self, exec_id: str | None) -> ExitInfo:
        """The exec's exit status; Docker records it a moment after the process ends."""
        if exec_id is None:
            return ExitInfo(exit_code=None)
        with anyio.move_on_after(EXIT_WAIT_S):
            while True:
                try:
                    data = await call((await self.docker()).api.exec_inspect, exec_id)
                except DOCKER_ERRORS:  # gone with its container, or the engine is down
                    return ExitInfo(exit_code=None)
                if not data.get("Running") and data.get("ExitCode") is not None:
                    return ExitInfo.from_returncode(int(data["ExitCode"]))
                await anyio.sleep(0.05)
        return ExitInfo(exit_code=None)

    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        """SIGTERM the exec's host process tree, SIGKILL what outlives ``grace_s``; the container stays."""
        killed: list[int] = []
        if proctree.same_process(instance.pid, instance.create_time) is not None:
            killed = await proctree.terminate_tree(instance.pid, grace_s)
        return replace(await self.wait(instance), killed=tuple(killed))

    async def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
        if not instance.log_path:
            return
        host_path = instance.log_path
        async for line in follow_file(Path(host_path), done, truncate_over=RAW_LOG_LIMIT,
                                      opener=lambda: open_log(host_path)):
            yield line


RUNTIME = DockerExecRuntime  # what sparkd.runtime.runtime_class finds for this kind
