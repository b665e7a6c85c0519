"""The real-Docker test infrastructure works: image, the project's Python inside, host network, exec PIDs."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from freeport import free_port
from waiting import until

import sparkd

pytestmark = pytest.mark.docker

TIMEOUT = 60.0


def test_image_exists_with_recipe_label(docker_client: Any, test_image: str) -> None:
    image = docker_client.images.get(test_image)
    labels = image.attrs["Config"]["Labels"]
    assert labels["sparkd.test"] == "1"
    assert labels["sparkd.test.recipe"]


def test_python_mounts_cover_interpreter_venv_and_repo(python_mounts: dict[str, dict[str, str]]) -> None:
    import sys

    binds = {v["bind"] for v in python_mounts.values()}
    assert all(v["mode"] == "ro" for v in python_mounts.values())
    assert "/usr" in binds

    def covered(path: str) -> bool:
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds)

    repo = str(Path(sparkd.__file__).resolve().parent.parent)
    for path in (sys.base_prefix, sys.prefix, repo, os.path.realpath(sys.executable)):
        assert covered(path), f"{path} not mounted: {python_mounts}"
    # Nothing mounted twice: no destination nested inside another.
    for b in binds:
        assert not any(b != o and b.startswith(o.rstrip("/") + "/") for o in binds), binds


def test_container_runs_the_repo_venv_python(make_container: Callable[..., Any], venv_python: str) -> None:
    container = make_container([venv_python, "-c", "import sparkd, psutil; print(sparkd.__version__)"])
    status = container.wait(timeout=TIMEOUT)
    logs = container.logs().decode()
    assert status["StatusCode"] == 0, logs
    assert logs.strip() == sparkd.__version__


def test_host_network_socket_reachable_from_host(make_container: Callable[..., Any], venv_python: str) -> None:
    port = free_port()
    server = (
        "import socket\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\n"
        "s.listen(1)\n"
        "c, _ = s.accept()\n"
        "c.sendall(b'pong from container')\n"
        "c.close()\n"
    )
    container = make_container([venv_python, "-c", server])

    def connect() -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            container.reload()
            assert container.status in {"created", "running"}, container.logs().decode()
            return None

    conn = until(connect, f"the container's listener on 127.0.0.1:{port}")
    with conn:
        conn.settimeout(TIMEOUT)
        data = b""
        while chunk := conn.recv(1024):
            data += chunk
    assert data == b"pong from container"
    assert container.wait(timeout=TIMEOUT)["StatusCode"] == 0


def test_exec_output_and_host_pid(docker_client: Any, make_container: Callable[..., Any]) -> None:
    container = make_container()  # sleep infinity

    # A command that ends before its stream is attached may lose its output (moby/moby#27289): not this one.
    code, output = container.exec_run(["sh", "-c", "sleep 0.5; echo hello from exec"])
    assert code == 0
    assert output.decode().strip() == "hello from exec"

    # A long-running exec: its host PID comes from exec_inspect and is a real process in the host's /proc,
    # which is how sparkd stops exec'd processes (Docker has no API to kill an exec).
    exec_id = docker_client.api.exec_create(container.id, ["sleep", "1000"])["Id"]
    docker_client.api.exec_start(exec_id, detach=True)
    info = until(
        lambda: (i := docker_client.api.exec_inspect(exec_id))["Running"] and i["Pid"] and i,
        "the exec to be running with a PID",
    )
    pid = info["Pid"]
    assert os.path.isdir(f"/proc/{pid}")
    proc = psutil.Process(pid)
    # The PID is reported while it is still `runc init` (before its execve): the same process, a moment later.
    until(lambda: proc.cmdline() == ["sleep", "1000"], "the exec's process to become `sleep 1000`")
    # It lives in the container's cgroup, not ours.
    cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    assert container.id in cgroup

    os.kill(pid, signal.SIGKILL)
    done = until(lambda: not (i := docker_client.api.exec_inspect(exec_id))["Running"] and i, "the exec to end")
    assert done["ExitCode"] == 128 + signal.SIGKILL
    container.reload()
    assert container.status == "running"  # killing the exec leaves the container alone


def test_containers_carry_session_labels(
    make_container: Callable[..., Any], docker_test_labels: dict[str, str]
) -> None:
    container = make_container(start=False)
    for key, value in docker_test_labels.items():
        assert container.labels[key] == value
    attrs = container.attrs["HostConfig"]
    assert attrs["NetworkMode"] == "host"
    assert not attrs.get("Privileged")
