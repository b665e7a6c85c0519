"""The docker-exec runtime against a real engine: vLLM's place is taken by small bash/python programs exec'd
into a long-lived container of the test image (the host's /usr, Python, venv and repo mounted read-only)."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest
from docker_runtime_support import HANDLES_TERM, IGNORES_TERM, TIMEOUT, Follower, anyio_backend, py, sh

from sparkd.config import Config, config_from_mapping
from sparkd.launch import LaunchSpec
from sparkd.runtime.base import LaunchError
from sparkd.runtime.docker_exec import LOG_IN_CONTAINER, DockerExecRuntime
from sparkd.runtime.dockerutil import container_options, rehearse_paths

__all__ = ["anyio_backend"]  # the fixture, used by pytest.mark.anyio

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


class Setup:
    """One test's container name, node name, configs and runtimes; removes what they created."""

    def __init__(self, client: Any, image: str, mounts: dict[str, dict[str, str]], labels: dict[str, str],
                 session: str) -> None:
        self.client, self.image, self.labels, self.session = client, image, labels, session
        self.mounts = [{"source": src, "target": m["bind"], "read_only": m["mode"] == "ro"}
                       for src, m in mounts.items()]
        tag = uuid.uuid4().hex[:8]
        self.name = f"sparkd-exec-{session}-{tag}"
        self.node = f"node-{tag}"

    def config(self, *, image: str | None = None, mounts: list[dict[str, Any]] | None = None,
               gpus: str | None = None) -> Config:
        data = {
            "node": {"name": self.node},
            "runtime": "docker-exec",
            "container": {
                "name": self.name, "image": image or self.image,
                "mounts": self.mounts if mounts is None else mounts,
                "gpus": gpus, "host_network": True, "host_ipc": False,
                "env": {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            },
            "launch": {"model": "m"},
        }
        return config_from_mapping(data, env={})

    def runtime(self, cfg: Config | None = None, *, rehearse: bool = False) -> DockerExecRuntime:
        return DockerExecRuntime(cfg or self.config(), rehearse=rehearse, labels=self.labels)

    def container(self) -> Any:
        return self.client.containers.get(self.name)

    def remove(self) -> None:
        for container in self.client.containers.list(all=True, filters={"name": self.name}):
            if container.labels.get("sparkd.test.session") == self.session:
                container.remove(force=True, v=True)


@pytest.fixture
def setup(docker_client: Any, test_image: str, python_mounts: dict[str, dict[str, str]],
          docker_test_labels: dict[str, str], docker_session_id: str) -> Iterator[Setup]:
    s = Setup(docker_client, test_image, python_mounts, docker_test_labels, docker_session_id)
    try:
        yield s
    finally:
        s.remove()


async def wait_until(predicate: Callable[[], Any], what: str) -> Any:
    with anyio.fail_after(TIMEOUT):
        while not (value := predicate()):
            await anyio.sleep(0.05)
    assert value, what
    return value


# ---------------------------------------------------------------------------------------------------------


def test_gpus_are_requested_only_when_configured(setup: Setup) -> None:
    def requests(gpus: str | None) -> list[dict[str, Any]] | None:
        options = container_options(setup.config(gpus=gpus), entrypoint=["sleep", "infinity"], labels={},
                                    rehearse=False, name="x")
        return options.get("device_requests")

    assert requests(None) is None
    assert requests("all") == [{"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]],
                                "Options": {}}]
    assert requests("2")[0]["Count"] == 2  # type: ignore[index]
    assert requests("device=0,1")[0]["DeviceIDs"] == ["0", "1"]  # type: ignore[index]


async def test_creates_missing_container_and_reports_exit_code_and_lines(setup: Setup) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(sh("echo first; echo second >&2; printf 'no newline'; exit 3"))

    container = setup.container()
    assert container.status == "running"
    assert container.labels["sparkd.managed"] == "1"
    assert container.labels["sparkd.node"] == setup.node
    assert container.attrs["Config"]["Entrypoint"] == ["sleep", "infinity"]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    assert instance.container_id == container.id and instance.exec_id
    assert instance.log_path == f"/proc/{container.attrs['State']['Pid']}/root{LOG_IN_CONTAINER}"

    with anyio.fail_after(TIMEOUT):
        info = await runtime.wait(instance)
        follower = Follower(runtime, instance)
        follower.done.set()
        await follower.run()
    assert info.exit_code == 3 and info.signal is None
    assert follower.lines == ["first", "second", "no newline"]
    assert await runtime.wait(instance) == info  # remembered


async def test_exec_pid_is_a_host_process_and_stop_sends_sigterm(setup: Setup, venv_python: str) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(py(venv_python, HANDLES_TERM))
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        # bash -c execs bash SCRIPT, which execs python: the exec's host PID is the program itself.
        proc = psutil.Process(instance.pid)
        assert proc.cmdline()[:2] == [venv_python, "-u"]
        assert abs(proc.create_time() - instance.create_time) < 0.01
        assert setup.container().id in Path(f"/proc/{instance.pid}/cgroup").read_text()
        assert instance.pid in runtime.pids(instance)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=30)
        follower.done.set()
    assert info.exit_code == 7
    assert "got SIGTERM" in follower.lines
    assert not psutil.pid_exists(instance.pid) or psutil.Process(instance.pid).status() == "zombie"
    assert setup.container().status == "running"  # stopping vLLM leaves the container alone


async def test_stop_kills_what_ignores_sigterm_after_the_grace(setup: Setup, venv_python: str) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(py(venv_python, IGNORES_TERM))
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        started = time.monotonic()
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=1.0)
        follower.done.set()
    assert time.monotonic() - started >= 1.0
    assert info.exit_code == 137 and info.signal == 9


async def test_stopped_container_is_started(setup: Setup) -> None:
    runtime = setup.runtime()
    container = await runtime.ensure_container()
    container.stop(timeout=5)
    container.reload()
    assert container.status == "exited"
    instance = await runtime.launch(sh("echo again; exit 0"))
    assert setup.container().status == "running"
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 0


async def test_an_exec_that_ends_at_once_still_reports_its_status(setup: Setup) -> None:
    runtime = setup.runtime()
    await runtime.ensure_container()
    instance = await runtime.launch(sh("exit 4"))
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 4


async def test_adopted_by_a_new_runtime_from_its_record(setup: Setup, venv_python: str) -> None:
    first = setup.runtime()
    instance = await first.launch(py(venv_python, HANDLES_TERM))
    record = json.loads(json.dumps(instance.to_record()))

    second = setup.runtime()
    found = await second.find(record)
    assert found is not None
    assert (found.pid, found.create_time, found.exec_id) == (instance.pid, instance.create_time, instance.exec_id)
    assert found.log_path == instance.log_path

    # Without the record (the daemon died before writing it), the running exec of ours is found anyway.
    scanned = await setup.runtime().find(None)
    assert scanned is not None
    assert (scanned.pid, scanned.exec_id, scanned.config_hash) == (instance.pid, instance.exec_id, "h-py")

    with pytest.raises(LaunchError) as err:  # at most one vLLM per node
        await second.launch(py(venv_python, HANDLES_TERM))
    assert f"an earlier launch still runs in container {setup.name} (host PID {instance.pid})" in str(err.value)
    inspected = await second.inspect(found)
    assert inspected is not None and inspected["Id"] == instance.container_id

    follower = Follower(second, found)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")  # the adopted output is read from its start
        with anyio.fail_after(TIMEOUT):
            info = await second.stop(found, grace_s=30)
        follower.done.set()
    assert info.exit_code == 7  # exec_inspect knows the status even for an instance we did not start
    assert await setup.runtime().find(record) is None
    assert await setup.runtime().find(None) is None


async def test_missing_target_names_the_path_and_the_container(
    setup: Setup, venv_python: str, tmp_path: Path,
) -> None:
    script = tmp_path / "vllm-head.sh"
    script.write_text("exec true\n")
    mounts = [*setup.mounts, {"source": str(tmp_path), "target": str(tmp_path), "read_only": True}]
    runtime = setup.runtime(setup.config(mounts=mounts))
    name = setup.name

    assert await runtime.missing_target(LaunchSpec(argv=("/workspace/vllm",))) == (
        f"the launch target /workspace/vllm does not exist in container {name}")
    assert await runtime.missing_target(LaunchSpec(argv=("bash", "/workspace/vllm-head.sh"))) == (
        f"the launch target /workspace/vllm-head.sh does not exist in container {name}")
    assert await runtime.missing_target(LaunchSpec(argv=("no-such-vllm", "serve"))) == (
        f"the launch target no-such-vllm is not on PATH in container {name}")
    assert await runtime.missing_target(LaunchSpec(argv=("/etc/hosts",))) == (
        f"the launch target /etc/hosts is not executable in container {name}")
    assert await runtime.missing_target(LaunchSpec(argv=(venv_python, "-m", "x"))) is None
    assert await runtime.missing_target(LaunchSpec(argv=("bash", str(script)))) is None
    assert await runtime.missing_target(LaunchSpec(argv=("bash", "-c", "true"))) is None
    # The spec's PATH is the one the launch script exports.
    script.chmod(0o755)
    assert await runtime.missing_target(LaunchSpec(argv=("vllm-head.sh",))) == (
        f"the launch target vllm-head.sh is not on PATH in container {name}")
    spec = LaunchSpec(argv=("vllm-head.sh",), env={"PATH": f"{tmp_path}:/usr/bin"})
    assert await runtime.missing_target(spec) is None


async def test_missing_target_reports_another_image(setup: Setup) -> None:
    await setup.runtime().ensure_container()
    other = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    problem = await other.missing_target(LaunchSpec(argv=("bash", "-c", "true")))
    assert problem is not None
    assert problem.startswith(f"container {setup.name} runs image sparkd-test:latest (")
    assert problem.endswith("the config says sparkd-test-elsewhere:nope (not on this node)")


async def test_missing_image_is_a_launch_error(setup: Setup) -> None:
    runtime = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    with pytest.raises(LaunchError) as err:
        await runtime.launch(sh("true"))
    assert err.value.exit_code == 127
    assert "sparkd-test-elsewhere:nope" in str(err.value) and "not on this node" in str(err.value)


async def test_rehearsal_mounts_the_host_python_and_refuses_a_container_without_them(
    setup: Setup, venv_python: str,
) -> None:
    usr_only = [{"source": "/usr", "target": "/usr", "read_only": True}]
    # An existing container without the host's Python: a rehearsal cannot run in it.
    await setup.runtime(setup.config(mounts=usr_only)).ensure_container()
    rehearsal = setup.runtime(setup.config(mounts=usr_only), rehearse=True)
    with pytest.raises(LaunchError) as err:
        await rehearsal.launch(py(sys.executable, "print('hi')"))
    assert f"container {setup.name} lacks the read-only mounts" in str(err.value)
    for path in rehearse_paths():
        assert path in str(err.value)
    assert await rehearsal.missing_target(py(sys.executable, "print('hi')")) == str(err.value)

    # Created by a rehearsal, the container gets them, and the host's sparkd runs inside.
    setup.remove()
    instance = await rehearsal.launch(py(sys.executable, "import sparkd; print(sparkd.__file__)"))
    targets = {m["Destination"]: m for m in setup.container().attrs["Mounts"]}
    for path in rehearse_paths():
        assert path in targets and targets[path]["RW"] is False
    with anyio.fail_after(TIMEOUT):
        info = await rehearsal.wait(instance)
        follower = Follower(rehearsal, instance)
        follower.done.set()
        await follower.run()
    assert info.exit_code == 0, follower.lines
    assert follower.lines == [str(Path(sys.modules["sparkd"].__file__ or "").resolve())]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_standin_serves_health_from_the_container(setup: Setup) -> None:
    port = free_port()
    runtime = setup.runtime(rehearse=True)
    spec = LaunchSpec(
        argv=(sys.executable, "-m", "sparkd_standin", "serve", "m", "--port", str(port), "--host", "127.0.0.1"),
        env={"SPARKD_STANDIN_STARTUP_SECONDS": "1"}, config_hash="h-standin",
    )
    assert await runtime.missing_target(spec) is None
    instance = await runtime.launch(spec)
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        async with httpx.AsyncClient() as client:
            with anyio.move_on_after(TIMEOUT):
                while True:
                    try:
                        if (await client.get(f"http://127.0.0.1:{port}/health", timeout=2)).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await anyio.sleep(0.2)
            assert (await client.get(f"http://127.0.0.1:{port}/health", timeout=2)).status_code == 200, (
                follower.lines[-30:])
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=30)
        follower.done.set()
    assert info.signal != 9, follower.lines[-20:]
