"""What only the docker-run runtime does (the shared behaviours are in test_runtime_contract.py): a labelled
container per launch whose PID 1 is vLLM, exits from die events checked against inspect, ``docker logs`` read
with timestamps so a reopened stream repeats nothing, the stopped container kept as evidence until the next
launch, and never a container it did not launch."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import docker.errors
import pytest
from docker_runtime_support import HANDLES_TERM, TIMEOUT, DockerPlace, py, run_to_end, sh

from sparkd.config import RuntimeKind
from sparkd.runtime.base import LaunchError
from sparkd.runtime.container_spec import rehearse_paths
from sparkd.runtime.docker_run import _Lines, split_stamp


@pytest.fixture
def setup(docker_client: Any, test_image: str, python_mounts: dict[str, dict[str, str]],
          docker_test_labels: dict[str, str], docker_session_id: str, tmp_path: Path) -> Iterator[DockerPlace]:
    place = DockerPlace(RuntimeKind.docker_run, docker_client, test_image, python_mounts, docker_test_labels,
                        docker_session_id, tmp_path)
    try:
        yield place
    finally:
        place.remove()


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


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_labelled_container_per_launch_kept_until_the_next(setup: DockerPlace, venv_python: str) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(py(venv_python, "import sys, time; time.sleep(0.5); sys.exit(3)",
                                       config_hash="abc123"))
    container = setup.container()
    assert container.id == instance.container_id
    assert (container.labels["sparkd.managed"], container.labels["sparkd.node"]) == ("1", setup.node)
    assert container.labels["sparkd.config_hash"] == "abc123"
    assert container.attrs["Config"]["Entrypoint"] == ["bash", "/tmp/sparkd-launch.sh"]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert instance.pid == container.attrs["State"]["Pid"]  # vLLM is the container's PID 1
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 3
    seen = runtime.last_inspect(instance)
    assert seen is not None and seen["State"]["ExitCode"] == 3 and seen["State"]["OOMKilled"] is False
    assert setup.client.containers.get(instance.container_id).status == "exited"  # kept as evidence

    again = await runtime.launch(sh("exit 0"))
    assert again.container_id != instance.container_id
    with pytest.raises(docker.errors.NotFound):
        setup.client.containers.get(instance.container_id)
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(again)).exit_code == 0


@pytest.mark.docker
@pytest.mark.anyio
async def test_found_by_labels_one_at_a_time_and_a_cancelled_wait_returns(setup: DockerPlace,
                                                                          venv_python: str) -> None:
    runtime = setup.runtime()
    instance = await runtime.launch(py(venv_python, HANDLES_TERM, config_hash="hash-1"))
    by_labels = await setup.runtime().find(None)
    assert by_labels is not None
    assert (by_labels.container_id, by_labels.config_hash) == (instance.container_id, "hash-1")
    with pytest.raises(LaunchError) as err:  # at most one vLLM per node
        await setup.runtime().launch(py(venv_python, HANDLES_TERM))
    assert f"container {setup.name} of an earlier launch is still running" in str(err.value)
    with anyio.move_on_after(0.5) as scope:  # a cancelled wait closes its events stream and returns
        await runtime.wait(by_labels)
    assert scope.cancelled_caught
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.stop(instance, grace_s=30)).exit_code == 7
    assert await setup.runtime().find(None) is None


@pytest.mark.docker
@pytest.mark.anyio
async def test_never_a_container_it_did_not_launch(setup: DockerPlace, make_container: Any) -> None:
    foreign = make_container(name=setup.name)
    with pytest.raises(LaunchError) as err:
        await setup.runtime().launch(sh("true"))
    assert f"a container named {setup.name} exists that sparkd did not launch" in str(err.value)
    foreign.reload()
    assert foreign.status == "running"  # untouched
    assert await setup.runtime().find(None) is None  # not labelled ours: never adopted
    # A docker-exec container of the same node (main process `sleep infinity`) carries sparkd.managed and
    # sparkd.node too, but no config hash: never adopted either.
    make_container("sleep infinity", labels={"sparkd.managed": "1", "sparkd.node": setup.node})
    assert await setup.runtime().find(None) is None


@pytest.mark.docker
@pytest.mark.anyio
async def test_the_target_is_checked_in_a_container_of_the_image_removed_after(setup: DockerPlace) -> None:
    runtime = setup.runtime()
    assert await runtime.missing_target(sh("true")) is None
    assert setup.ours() == []  # the check containers are gone
    elsewhere = setup.runtime(setup.config(image="sparkd-test-elsewhere:nope"))
    assert await elsewhere.missing_target(sh("true")) == (
        "the image sparkd-test-elsewhere:nope is not on this node (pull or build it)")
    with pytest.raises(LaunchError) as err:
        await elsewhere.launch(sh("true"))
    assert err.value.exit_code == 127


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_rehearsal_mounts_the_host_python(setup: DockerPlace) -> None:
    usr_only = [{"source": "/usr", "target": "/usr", "read_only": True}]
    runtime = setup.runtime(setup.config(mounts=usr_only), rehearse=True)
    spec = py(sys.executable, "import sparkd; print(sparkd.__file__)")
    assert await runtime.missing_target(spec) is None
    instance = await runtime.launch(spec)
    targets = {m["Destination"]: m for m in setup.client.containers.get(instance.container_id).attrs["Mounts"]}
    for path in rehearse_paths():
        assert path in targets and targets[path]["RW"] is False
    code, lines = await run_to_end(runtime, instance)
    assert code == 0, lines
    assert lines == [str(Path(sys.modules["sparkd"].__file__ or "").resolve())]


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_container_lets_vllm_drain_and_keeps_its_compile_cache(setup: DockerPlace, venv_python: str) -> None:
    """Issue 36: whoever stops the container (`docker stop` without -t, the engine's shutdown) waits the drained
    stop's grace, and vLLM's compile cache is bound from the host, so the next launch's new container finds it."""
    from sparkd.supervisor.graces import container_stop_timeout_s

    cfg = setup.config(sections={"stop": {"drain_s": 40}, "supervisor": {"stop_grace_s": 7}})
    runtime = setup.runtime(cfg)
    instance = await runtime.launch(py(venv_python, "import os, pathlib; p = pathlib.Path('/root/.cache/vllm/x'); "
                                       "p.write_text(str(os.getpid()))"))
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 0
    attrs = setup.container().attrs
    assert attrs["Config"]["StopTimeout"] == 47 == container_stop_timeout_s(cfg)
    binds = {m["Destination"]: m["Source"] for m in attrs["Mounts"]}
    assert binds["/root/.cache/vllm"] == str(setup.shared_dir / "caches" / "vllm"), binds
    assert binds["/root/.cache/flashinfer"] == str(setup.shared_dir / "caches" / "flashinfer"), binds
    assert (setup.shared_dir / "caches" / "vllm" / "x").read_text(), "written in the container, kept on the host"
