"""sparkd run with the docker runtimes: the stand-in inside a real container, crash recovery, adoption after
a daemon SIGKILL, and a clean stop."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import STANDIN, Sparkd, alive, base_config, free_port, kill_tree, tree

pytestmark = pytest.mark.docker

RUNTIMES = ["docker-exec", "docker-run"]


@pytest.fixture
def docker_daemon(tmp_path: Path, test_image: str, python_mounts: dict[str, dict[str, str]],
                  docker_test_labels: dict[str, str], docker_client: Any) -> Iterator[Any]:
    made: list[Sparkd] = []
    seen: list[psutil.Process] = []

    def make(runtime: str) -> Sparkd:
        folder = tmp_path / f"d{len(made)}"
        folder.mkdir()
        name = f"sparkd-test-{uuid.uuid4().hex[:8]}"
        mounts = [{"source": src, "target": opt["bind"], "read_only": opt.get("mode") == "ro"}
                  for src, opt in python_mounts.items()]
        cfg = base_config(folder, free_port(), container={
            "name": name, "image": test_image, "mounts": mounts, "gpus": "", "host_ipc": True,
            "labels": docker_test_labels})
        cfg["runtime"] = runtime
        cfg["node"]["name"] = name  # a node of its own: adoption must never find another test's container
        cfg["launch"]["executable"] = str(STANDIN)
        daemon = Sparkd(folder, cfg)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        pid = daemon.status().get("pid")
        if pid:
            seen.extend(tree(pid))
        daemon.stop()
    kill_tree(alive(seen))


def ready(daemon: Sparkd, launches: int = 1, timeout: float = 120) -> dict[str, Any]:
    return daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("launches", 0) >= launches
                           and (daemon.proc is None or s.get("daemon_pid") == daemon.proc.pid),
                           timeout, f"ready after launch {launches}")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_crash_in_a_container_is_recovered_with_evidence(docker_daemon: Any, runtime: str) -> None:
    daemon = docker_daemon(runtime).start()
    first = ready(daemon)
    assert first["container_id"]
    os.kill(first["pid"], signal.SIGKILL)
    second = ready(daemon, launches=2)
    assert second["pid"] != first["pid"]
    assert second["last_failure"]["signal"] == signal.SIGKILL or second["last_failure"]["exit_code"] == 137
    folder = sorted((daemon.state_dir / "incidents").iterdir())[-1]
    assert (folder / "container.json").exists(), "the incident carries docker inspect"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_daemon_sigkill_then_restart_adopts_the_container_instance(docker_daemon: Any, runtime: str) -> None:
    daemon = docker_daemon(runtime).start()
    first = ready(daemon)
    daemon.kill()
    daemon.start()
    again = ready(daemon, launches=0)
    assert again["pid"] == first["pid"] and again["launches"] == 0 and again["restarts"] == 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigterm_stops_vllm_in_the_container_and_leaves_nothing(docker_daemon: Any, runtime: str,
                                                                docker_client: Any) -> None:
    daemon = docker_daemon(runtime).start()
    status = ready(daemon)
    procs = tree(status["pid"])
    assert daemon.stop() == 0
    assert alive(procs) == []
    container = docker_client.containers.get(status["container_id"])
    if runtime == "docker-run":
        assert container.status == "exited"
    else:
        assert container.status == "running", "the long-lived container stays; only vLLM stops"
