"""The docker-run runtime against a real engine: each launch is a fresh container of the test image (the
host's /usr, Python, venv and repo mounted read-only) whose main process is a small bash/python program."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import docker.errors
import httpx
import psutil
import pytest
from docker_runtime_support import HANDLES_TERM, IGNORES_TERM, TIMEOUT, Follower, anyio_backend, py, sh

from sparkd.config import Config, config_from_mapping
from sparkd.launch import LaunchSpec
from sparkd.runtime.base import LaunchError
from sparkd.runtime.docker_run import DockerRunRuntime, _Lines, split_stamp
from sparkd.runtime.dockerutil import rehearse_paths

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
        self.name = f"sparkd-run-{session}-{tag}"
        self.node = f"node-{tag}"

    def config(self, *, image: str | None = None, mounts: list[dict[str, Any]] | None = None) -> Config:
        data = {
            "node": {"name": self.node},
            "runtime": "docker-run",
            "container": {
                "name": self.name, "image": image or self.image,
                "mounts": self.mounts if mounts is None else mounts,
                "gpus": None, "host_network": True, "host_ipc": False,
                "env": {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            },
            "launch": {"model": "m"},
        }
        return config_from_mapping(data, env={})

    def runtime(self, cfg: Config | None = None, *, rehearse: bool = False) -> DockerRunRuntime:
        return DockerRunRuntime(cfg or self.config(), rehearse=rehearse, labels=self.labels)

    def ours(self) -> list[Any]:
        """Every container of this test (launches and target checks), by the session and node labels."""
        return self.client.containers.list(all=True, filters={"label": [
            f"sparkd.test.session={self.session}", f"sparkd.node={self.node}"]})

    def remove(self) -> None:
        for container in self.ours():
            container.remove(force=True, v=True)


@pytest.fixture
def setup(docker_client: Any, test_image: str, python_mounts: dict[str, dict[str, str]],
          docker_test_labels: dict[str, str], docker_session_id: str) -> Iterator[Setup]:
    s = Setup(docker_client, test_image, python_mounts, docker_test_labels, docker_session_id)
    try:
        yield s
    finally:
        s.remove()


# ---------------------------------------------------------------------------------------------------------


def test_log_timestamps_are_split_with_nanoseconds() -> None:
    stamp, message = split_stamp(b"2026-11-26T01:25:27.809917650Z hello world\n")
    assert message == b"hello world\n"
    assert stamp == 1795656327 * 1_000_000_000 + 809917650
    assert split_stamp(b"2026-11-26T01:25:27.5+01:00 x") == (1795652727 * 1_000_000_000 + 500_000_000, b"x")
    assert split_stamp(b"no stamp") == (None, b"no stamp")


def test_a_reopened_log_stream_yields_no_line_twice() -> None:
    lines = _Lines()
    base = 1795656327 * 1_000_000_000

    def frame(offset_ms: int, text: str) -> bytes:
        ns = base + offset_ms * 1_000_000
        return f"2026-11-26T01:25:{27 + ns // 10**9 - base // 10**9:02d}.{ns % 10**9:09d}Z {text}".encode()

    frames = [frame(0, "a\n"), frame(30, "c\n"), frame(20, "b (stderr, stamped earlier)\n"), frame(2500, "d")]
    assert [line for f in frames for line in lines.feed(f)] == ["a", "c", "b (stderr, stamped earlier)"]
    assert lines.since_s == 1795656327  # reopen from 2 s before the newest frame
    # The reopened stream repeats what it has since then, then goes on.
    assert [line for f in [*frames, frame(2600, " e\n")] for line in lines.feed(f)] == ["d e"]
    assert lines.end() == []


async def test_labels_exit_code_from_events_and_lines(setup: Setup, venv_python: str) -> None:
    runtime = setup.runtime()
    program = "import sys; print('first'); print('second', file=sys.stderr); print('last', end=''); sys.exit(3)"
    instance = await runtime.launch(py(venv_python, "import time; time.sleep(0.5)\n" + program,
                                       config_hash="abc123"))
    container = setup.client.containers.get(setup.name)
    assert container.id == instance.container_id
    assert container.labels["sparkd.managed"] == "1"
    assert container.labels["sparkd.node"] == setup.node
    assert container.labels["sparkd.config_hash"] == "abc123"
    assert container.attrs["Config"]["Entrypoint"] == ["bash", "/tmp/sparkd-launch.sh"]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert instance.pid == container.attrs["State"]["Pid"]

    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.wait(instance)
            follower.done.set()
            await follower.ended.wait()
    assert info.exit_code == 3 and info.signal is None
    # stdout and stderr are separate pipes: only each one's own order is kept.
    assert sorted(follower.lines) == ["first", "last", "second"]
    assert follower.lines.index("first") < follower.lines.index("last")  # unterminated last line included
    seen = runtime.last_inspect(instance)
    assert seen is not None and seen["State"]["ExitCode"] == 3 and seen["State"]["OOMKilled"] is False
    inspected = await runtime.inspect(instance)
    assert inspected is not None and inspected["Id"] == instance.container_id


async def test_an_instance_that_ends_at_once_reports_its_status(setup: Setup) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(sh("exit 5"))
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 5
    assert await runtime.wait(instance) == await runtime.wait(instance)


async def test_stop_sigterm_then_keep_the_container_until_the_next_launch(
    setup: Setup, venv_python: str,
) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(py(venv_python, HANDLES_TERM))
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        # bash execs the script, which execs the program: it is the container's PID 1, seen by its host PID.
        assert psutil.Process(instance.pid).cmdline()[:2] == [venv_python, "-u"]
        assert instance.pid in runtime.pids(instance)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=30)
            await follower.ended.wait()  # the log stream ends with the container
    assert info.exit_code == 7
    assert "got SIGTERM" in follower.lines
    old = setup.client.containers.get(instance.container_id)
    assert old.status == "exited"  # kept as evidence

    again = await runtime.launch(sh("exit 0"))
    assert again.container_id != instance.container_id
    with pytest.raises(docker.errors.NotFound):
        setup.client.containers.get(instance.container_id)
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(again)).exit_code == 0


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


async def test_adopted_by_a_new_runtime_from_its_record_or_its_labels(setup: Setup, venv_python: str) -> None:
    first = setup.runtime()
    instance = await first.launch(py(venv_python, HANDLES_TERM, config_hash="hash-1"))
    record = json.loads(json.dumps(instance.to_record()))

    second = setup.runtime()
    found = await second.find(record)
    assert found is not None
    assert (found.pid, found.create_time, found.container_id) == (
        instance.pid, instance.create_time, instance.container_id)
    by_labels = await setup.runtime().find(None)
    assert by_labels is not None
    assert (by_labels.container_id, by_labels.config_hash) == (instance.container_id, "hash-1")

    with pytest.raises(LaunchError) as err:  # at most one vLLM per node
        await second.launch(py(venv_python, HANDLES_TERM))
    assert f"container {setup.name} of an earlier launch is still running" in str(err.value)
    with anyio.move_on_after(0.5) as scope:  # a cancelled wait closes its events stream and returns
        await second.wait(found)
    assert scope.cancelled_caught

    follower = Follower(second, found)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")  # docker logs replays the output from the start
        with anyio.fail_after(TIMEOUT):
            info = await second.stop(found, grace_s=30)
        follower.done.set()
    assert info.exit_code == 7
    assert await setup.runtime().find(record) is None
    assert await setup.runtime().find(None) is None


async def test_launch_refuses_a_container_it_did_not_create(
    setup: Setup, make_container: Any,
) -> None:
    foreign = make_container(name=setup.name)
    with pytest.raises(LaunchError) as err:
        await setup.runtime().launch(sh("true"))
    assert f"a container named {setup.name} exists that sparkd did not launch" in str(err.value)
    foreign.reload()
    assert foreign.status == "running"  # untouched
    assert await setup.runtime().find(None) is None  # not labelled ours: never adopted


async def test_missing_target_checks_in_the_image(setup: Setup, venv_python: str, tmp_path: Path) -> None:
    script = tmp_path / "vllm-head.sh"
    script.write_text("exec true\n")
    mounts = [*setup.mounts, {"source": str(tmp_path), "target": str(tmp_path), "read_only": True}]
    runtime = setup.runtime(setup.config(mounts=mounts))
    image = setup.image

    assert await runtime.missing_target(LaunchSpec(argv=("/workspace/vllm", "serve"))) == (
        f"the launch target /workspace/vllm does not exist in image {image}")
    assert await runtime.missing_target(LaunchSpec(argv=("bash", "/workspace/vllm-head.sh"))) == (
        f"the launch target /workspace/vllm-head.sh does not exist in image {image}")
    assert await runtime.missing_target(LaunchSpec(argv=("no-such-vllm", "serve"))) == (
        f"the launch target no-such-vllm is not on PATH in image {image}")
    assert await runtime.missing_target(LaunchSpec(argv=(venv_python, "-c", "pass"))) is None
    assert await runtime.missing_target(LaunchSpec(argv=("bash", str(script)))) is None
    assert setup.ours() == []  # the check containers are gone

    elsewhere = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    assert await elsewhere.missing_target(sh("true")) == (
        "the image sparkd-test-elsewhere:nope is not on this node (pull or build it)")
    with pytest.raises(LaunchError) as err:
        await elsewhere.launch(sh("true"))
    assert err.value.exit_code == 127


async def test_rehearsal_mounts_the_host_python(setup: Setup) -> None:
    usr_only = [{"source": "/usr", "target": "/usr", "read_only": True}]
    runtime = setup.runtime(setup.config(mounts=usr_only), rehearse=True)
    spec = py(sys.executable, "import sparkd; print(sparkd.__file__)")
    assert await runtime.missing_target(spec) is None
    instance = await runtime.launch(spec)
    container = setup.client.containers.get(instance.container_id)
    targets = {m["Destination"]: m for m in container.attrs["Mounts"]}
    for path in rehearse_paths():
        assert path in targets and targets[path]["RW"] is False
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.wait(instance)
            follower.done.set()
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
            await follower.ended.wait()
    assert info.signal != 9, follower.lines[-20:]
    assert follower.lines, "the stand-in's output arrives through docker logs"


async def test_find_never_adopts_a_docker_exec_container_of_the_same_node(setup: Setup,
                                                                            make_container: Any) -> None:
    """A docker-exec container (main process `sleep infinity`) carries sparkd.managed and sparkd.node too."""
    make_container("sleep infinity", labels={"sparkd.managed": "1", "sparkd.node": setup.node})
    assert await setup.runtime().find(None) is None
