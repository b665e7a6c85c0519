"""The runtime contract: the same behaviours over every way of running vLLM (``process``, ``docker-exec``,
``docker-run``), against the real host and the real Docker engine. vLLM's place is taken by small bash/python
programs and by the stand-in.

Each test takes ``place``: the runtime kind under test with a fresh place to run in (a tmp dir on the host, or a
container name and node of its own on the test image, with the host's Python, venv and repo and the test's tmp dir
mounted at the same paths). What differs between kinds is data on the place, never a branch in a test.

Adding a runtime (podman, say): write ``sparkd/runtime/podman.py`` (a ``Runtime`` subclass), add its
``RuntimeKind`` member (its module, named by it, sets ``RUNTIME``), then add one ``pytest.param`` to ``KINDS`` below
(and, if it needs an engine, a place class like ``DockerPlace`` in docker_runtime_support.py built in ``place``).
Every test here then runs against it. Behaviour only one runtime has stays in its own small file
(test_runtime_docker_exec.py, test_runtime_docker_run.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from docker_runtime_support import (
    HANDLES_TERM,
    IGNORES_TERM_TREE,
    TIMEOUT,
    DockerPlace,
    Follower,
    py,
    run_to_end,
    sh,
)
from freeport import free_port

from sparkd.config import RuntimeKind
from sparkd.launch.render import LaunchSpec
from sparkd.runtime.base import Runtime
from sparkd.runtime.process import ProcessRuntime

pytestmark = pytest.mark.anyio

KINDS = [
    pytest.param(RuntimeKind.process, id="process"),
    pytest.param(RuntimeKind.docker_exec, id="docker-exec", marks=pytest.mark.docker),
    pytest.param(RuntimeKind.docker_run, id="docker-run", marks=pytest.mark.docker),
]


@dataclass
class Place:
    """A runtime kind and where its instances run in this test."""

    kind: RuntimeKind
    python: str  # an interpreter path valid where vLLM runs
    shared_dir: Path  # a directory seen at the same path on the host and where vLLM runs
    # The exit status of an instance stopped by a runtime that did not launch it (adopted): a child's status
    # is its parent's to reap, so the process runtime cannot know it; the engine knows it for containers.
    adopted_status_known: bool
    where: str  # the runtime's own words for the place
    docker: DockerPlace | None = None

    def runtime(self, *, rehearse: bool = False) -> Runtime:
        if self.docker is not None:
            runtime: Runtime = self.docker.runtime(rehearse=rehearse)
            return runtime
        return ProcessRuntime(self.shared_dir / "run")


@pytest.fixture(params=KINDS)
def place(request: pytest.FixtureRequest, tmp_path: Path, venv_python: str) -> Iterator[Place]:
    kind: RuntimeKind = request.param
    if kind is RuntimeKind.process:
        yield Place(kind, venv_python, tmp_path, adopted_status_known=False, where="on this host")
        return
    docker = DockerPlace(
        kind, request.getfixturevalue("docker_client"), request.getfixturevalue("test_image"),
        request.getfixturevalue("python_mounts"), request.getfixturevalue("docker_test_labels"),
        request.getfixturevalue("docker_session_id"), tmp_path,
    )
    where = f"in container {docker.name}" if kind is RuntimeKind.docker_exec else f"in image {docker.image}"
    try:
        yield Place(kind, venv_python, tmp_path, adopted_status_known=True, where=where, docker=docker)
    finally:
        docker.remove()


# ---- launch, wait, exit status, log lines -----------------------------------------------------------------------


async def test_launch_wait_reports_the_exit_status_and_every_line(place: Place) -> None:
    runtime = place.runtime()
    program = ("import sys, time; time.sleep(0.5); print('first'); print('second', file=sys.stderr); "
               "print('last', end=''); sys.exit(3)")
    instance = await runtime.launch(py(place.python, program))
    assert instance.runtime == runtime.name and instance.config_hash == "h-py"
    code, lines = await run_to_end(runtime, instance)
    assert code == 3
    # stdout and stderr may be separate pipes: only each one's own order is kept. The unterminated last line counts.
    assert sorted(lines) == ["first", "last", "second"]
    assert lines.index("first") < lines.index("last")
    assert (await runtime.wait(instance)).exit_code == 3  # remembered


async def test_a_missing_target_is_named_and_its_launch_ends_at_once_with_127(place: Place) -> None:
    runtime = place.runtime()
    ghost = LaunchSpec(argv=("/workspace/vllm-head-090.sh",), config_hash="h-ghost")
    problem = await runtime.missing_target(ghost)
    assert problem is not None and problem.startswith("the launch target /workspace/vllm-head-090.sh does not exist")
    instance = await runtime.launch(ghost)  # the launch itself does not check: bash says 127, as in the field
    with anyio.fail_after(TIMEOUT):
        assert (await runtime.wait(instance)).exit_code == 127


async def test_missing_target_sentences(place: Place) -> None:
    runtime = place.runtime()
    script = place.shared_dir / "vllm-head.sh"
    script.write_text("exec true\n")
    plain = place.shared_dir / "weights.bin"
    plain.write_text("")
    plain.chmod(0o644)

    async def problem(*argv: str, env: dict[str, str] | None = None) -> str | None:
        return await runtime.missing_target(LaunchSpec(argv=argv, env=env or {}))

    assert (await problem("bash", "/workspace/vllm-head.sh") or "").startswith(
        "the launch target /workspace/vllm-head.sh does not exist")
    assert (await problem("no-such-vllm", "serve") or "").startswith("the launch target no-such-vllm is not on PATH")
    assert (await problem(str(plain)) or "").startswith(f"the launch target {plain} is not executable")
    assert await problem(place.python, "-c", "pass") is None
    assert await problem("bash", str(script)) is None
    assert await problem("bash", "-c", "true") is None
    script.chmod(0o755)  # the PATH the launch script exports is the one that counts
    assert (await problem("vllm-head.sh") or "").startswith("the launch target vllm-head.sh is not on PATH")
    assert await problem("vllm-head.sh", env={"PATH": f"{place.shared_dir}:/usr/bin:/bin"}) is None


# ---- stop ---------------------------------------------------------------------------------------------------------


async def test_stop_sends_sigterm_and_reports_the_status(place: Place) -> None:
    runtime = place.runtime()
    instance = await runtime.launch(py(place.python, HANDLES_TERM))
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        # bash execs the script, which execs python: the instance's host PID is the program itself.
        assert psutil.Process(instance.pid).cmdline()[:2] == [place.python, "-u"]
        assert instance.pid in runtime.pids(instance)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=30)
        follower.done.set()
    assert info.exit_code == 7 and info.signal is None
    assert "got SIGTERM" in follower.lines


async def test_stop_kills_a_tree_that_ignores_sigterm_after_the_grace(place: Place) -> None:
    runtime = place.runtime()
    instance = await runtime.launch(py(place.python, IGNORES_TERM_TREE))
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")
        await follower.wait_for("child ready")
        tree = [psutil.Process(pid) for pid in runtime.pids(instance)]
        assert len(tree) >= 2, "the program and its child are both in the instance's tree"
        started = time.monotonic()
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=1.0)
        follower.done.set()
    assert time.monotonic() - started >= 1.0  # the grace was given
    assert info.signal == 9
    with anyio.fail_after(TIMEOUT):
        while alive := [p for p in tree if running(p)]:
            await anyio.sleep(0.05)
    assert alive == []


def running(proc: psutil.Process) -> bool:
    """Still a live process (a zombie waiting for its parent's reaping has ended)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- adoption -----------------------------------------------------------------------------------------------------


async def test_a_new_runtime_adopts_the_instance_from_its_record(place: Place) -> None:
    first = place.runtime()
    instance = await first.launch(py(place.python, HANDLES_TERM, config_hash="hash-1"))
    record = json.loads(json.dumps(instance.to_record()))  # as the state file keeps it

    second = place.runtime()  # a restarted daemon
    found = await second.find(record)
    assert found is not None
    assert (found.pid, found.create_time, found.container_id, found.config_hash) == (
        instance.pid, instance.create_time, instance.container_id, "hash-1")
    inspected = await second.inspect(found)
    assert inspected is not None  # what the engine or kernel says about it, for the incident folder

    follower = Follower(second, found)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await follower.wait_for("ready")  # the adopted output is read from its start
        with anyio.fail_after(TIMEOUT):
            info = await second.stop(found, grace_s=30)
        follower.done.set()
    assert info.exit_code == (7 if place.adopted_status_known else None)
    assert "got SIGTERM" in follower.lines
    assert await place.runtime().find(record) is None  # gone: nothing to adopt


async def test_a_record_of_another_runtime_or_a_dead_instance_is_not_adopted(place: Place) -> None:
    runtime = place.runtime()
    instance = await runtime.launch(sh("exit 0"))
    with anyio.fail_after(TIMEOUT):
        await runtime.wait(instance)
    record = instance.to_record()
    assert await place.runtime().find(record) is None
    assert await place.runtime().find({**record, "runtime": "something-else"}) is None


# ---- where vLLM runs --------------------------------------------------------------------------------------------


async def test_where_vllm_runs_commands_and_files(place: Place) -> None:
    runtime = place.runtime()
    assert runtime.where == place.where
    await runtime.missing_target(sh("true"))  # prepares the place, as preflight's first check does
    assert await runtime.pending_preparation() is None

    result = await runtime.exec(["sh", "-c", 'echo "out $X"; echo err >&2; exit 3'], env={"X": "y"})
    assert (result.exit_code, result.stdout, result.stderr.strip()) == (3, "out y\n", "err")
    assert (await runtime.exec(["no-such-command-here"])).exit_code == 127

    (place.shared_dir / "mxfp4.py").write_text("torch.cuda.empty_cache()\n" * 2)
    assert await runtime.read_file(str(place.shared_dir / "mxfp4.py")) == "torch.cuda.empty_cache()\n" * 2
    assert await runtime.read_file(str(place.shared_dir / "not-there.py")) is None


async def test_a_command_that_runs_too_long_is_ended_with_124(place: Place) -> None:
    runtime = place.runtime()
    await runtime.missing_target(sh("true"))
    marker = place.shared_dir / "still-running"
    with anyio.fail_after(TIMEOUT):
        result = await runtime.exec(["sh", "-c", f"sleep 2; touch {marker}"], timeout_s=0.5)
    assert result.exit_code == 124 and "timed out" in result.stderr
    await anyio.sleep(2.5)
    assert not marker.exists(), "the command was ended, not left running"


# ---- the stand-in -------------------------------------------------------------------------------------------------


async def wait_healthy(port: int, follower: Follower) -> None:
    async with httpx.AsyncClient() as client:
        with anyio.move_on_after(TIMEOUT):
            while True:
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/health", timeout=2)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.2)
    pytest.fail(f"the stand-in never answered /health: {follower.lines[-30:]}")


async def test_the_standin_serves_health_and_stops_on_sigterm(place: Place) -> None:
    runtime = place.runtime(rehearse=True)
    port = free_port()
    spec = LaunchSpec(
        argv=(sys.executable, "-m", "sparkd_standin", "serve", "m", "--port", str(port), "--host", "127.0.0.1"),
        env={"SPARKD_STANDIN_STARTUP_SECONDS": "1"}, config_hash="h-standin",
    )
    assert await runtime.missing_target(spec) is None
    instance = await runtime.launch(spec)
    follower = Follower(runtime, instance)
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.run)
        await wait_healthy(port, follower)
        with anyio.fail_after(TIMEOUT):
            info = await runtime.stop(instance, grace_s=30)
        follower.done.set()
    assert info.signal != 9, follower.lines[-20:]
    assert follower.lines, "the stand-in's output arrives through the runtime's log"


def test_every_runtime_kind_is_in_this_suite() -> None:
    assert {p.values[0] for p in KINDS} == set(RuntimeKind)
