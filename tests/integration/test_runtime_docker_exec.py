"""What only the docker-exec runtime does (the shared behaviours are in test_runtime_contract.py): it creates a
long-lived container of the configured image (or starts a stopped one), execs vLLM into it, leaves it running
when vLLM stops, finds its exec without a record, and refuses an image or rehearsal the container does not have."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from docker_runtime_support import HANDLES_TERM, TIMEOUT, DockerPlace, Follower, py, run_to_end, sh

from sparkd.config import RuntimeKind
from sparkd.runtime.base import LaunchError, TargetUnavailable
from sparkd.runtime.container_spec import rehearse_paths
from sparkd.runtime.docker_exec import LOG_IN_CONTAINER

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def setup(docker_client: Any, test_image: str, python_mounts: dict[str, dict[str, str]],
          docker_test_labels: dict[str, str], docker_session_id: str, tmp_path: Path) -> Iterator[DockerPlace]:
    place = DockerPlace(RuntimeKind.docker_exec, docker_client, test_image, python_mounts, docker_test_labels,
                        docker_session_id, tmp_path)
    try:
        yield place
    finally:
        place.remove()


async def test_creates_the_missing_container_and_leaves_it_running(setup: DockerPlace, venv_python: str) -> None:
    runtime = setup.runtime()
    assert await runtime.pending_preparation() == (
        f"container {setup.name} does not exist; the launch would create it from {setup.image}")
    instance = await runtime.launch(py(venv_python, HANDLES_TERM))
    container = setup.container()
    assert container.labels["sparkd.managed"] == "1" and container.labels["sparkd.node"] == setup.node
    assert container.attrs["Config"]["Entrypoint"] == ["sleep", "infinity"]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert container.attrs["HostConfig"]["NetworkMode"] == "host"
    assert instance.container_id == container.id and instance.exec_id
    assert instance.log_path == f"/proc/{container.attrs['State']['Pid']}/root{LOG_IN_CONTAINER}"

    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        assert container.id in Path(f"/proc/{instance.pid}/cgroup").read_text()  # a host PID in the container
        # At most one vLLM per node: a second launch is refused, a runtime without the record finds this one.
        with pytest.raises(LaunchError) as err:
            await setup.runtime().launch(sh("true"))
        assert f"an earlier launch still runs in container {setup.name} (host PID {instance.pid})" in str(err.value)
        scanned = await setup.runtime().find(None)
        assert scanned is not None and (scanned.pid, scanned.exec_id) == (instance.pid, instance.exec_id)
        with anyio.fail_after(TIMEOUT):
            await runtime.stop(instance, grace_s=30)
        follower.done.set()
    assert setup.container().status == "running"  # stopping vLLM leaves the container alone
    assert await setup.runtime().find(None) is None


async def test_a_stopped_container_is_started(setup: DockerPlace) -> None:
    runtime = setup.runtime()
    container = await runtime.ensure_container()
    container.stop(timeout=5)
    assert await runtime.pending_preparation() == f"container {setup.name} is exited; the launch would start it"
    with pytest.raises(TargetUnavailable, match="is exited"):
        await runtime.exec(["true"])  # nothing to exec into until the launch (or the target check) starts it
    instance = await runtime.launch(sh("echo again; exit 0"))
    assert setup.container().status == "running"
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 0


async def test_a_container_of_another_image_is_drift(setup: DockerPlace) -> None:
    await setup.runtime().ensure_container()
    assert await setup.runtime().drift() == []  # made from the config: nothing differs
    other = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    [difference] = await other.drift()
    assert difference.key == "container.image"
    assert difference.configured == "sparkd-test-elsewhere:nope (not on this node)"
    assert str(difference.actual).startswith("sparkd-test:latest (")


async def test_a_missing_image_is_a_launch_error(setup: DockerPlace) -> None:
    runtime = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    with pytest.raises(LaunchError) as err:
        await runtime.launch(sh("true"))
    assert err.value.exit_code == 127
    assert "sparkd-test-elsewhere:nope" in str(err.value) and "not on this node" in str(err.value)


async def test_a_rehearsal_refuses_a_container_without_the_host_python(setup: DockerPlace) -> None:
    usr_only = [{"source": "/usr", "target": "/usr", "read_only": True}]
    await setup.runtime(setup.config(mounts=usr_only)).ensure_container()
    rehearsal = setup.runtime(setup.config(mounts=usr_only), rehearse=True)
    with pytest.raises(LaunchError) as err:
        await rehearsal.launch(py(sys.executable, "print('hi')"))
    assert f"container {setup.name} lacks the read-only mounts" in str(err.value)
    for path in rehearse_paths():
        assert path in str(err.value)
    assert await rehearsal.missing_target(py(sys.executable, "print('hi')")) == str(err.value)

    setup.remove()  # created by a rehearsal, the container gets them, and the host's sparkd runs inside
    instance = await rehearsal.launch(py(sys.executable, "import sparkd; print(sparkd.__file__)"))
    targets = {m["Destination"]: m for m in setup.container().attrs["Mounts"]}
    for path in rehearse_paths():
        assert path in targets and targets[path]["RW"] is False
    code, lines = await run_to_end(rehearsal, instance)
    assert code == 0, lines
    assert lines == [str(Path(sys.modules["sparkd"].__file__ or "").resolve())]


async def test_an_engine_error_while_the_engine_takes_no_new_connection_is_a_wait(
        setup: DockerPlace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Docker engine on its way down closes its socket first, then stops its containers, and meanwhile still
    answers on connections already open with errors of its own (soak, the dockerd restart: "failed to update
    store for object type *libnetwork.endpoint"). A launch refused then is a wait, not a failure of the launch;
    the same refusal from an engine that takes new connections is one."""
    nowhere = [{"source": str(tmp_path / "not-there"), "target": "/mnt/x", "read_only": True}]
    runtime = setup.runtime(setup.config(mounts=nowhere))
    with pytest.raises(LaunchError) as err:
        await runtime.launch(sh("true"))
    assert "not-there" in str(err.value) and not err.value.unavailable
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'gone.sock'}")  # what a new connection meets now
    with pytest.raises(LaunchError) as err:
        await runtime.launch(sh("true"))  # on the connection it holds, to the engine that still answers
    assert "not-there" in str(err.value) and err.value.unavailable
