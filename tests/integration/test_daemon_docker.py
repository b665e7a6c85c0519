"""sparkd run with the docker runtimes: the stand-in inside a real container, crash recovery, adoption after
a daemon SIGKILL, and a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import STANDIN, Sparkd, alive, base_config, kill_tree, render_toml, tree
from freeport import free_port

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
            "labels": docker_test_labels, "compile_cache_dir": str(folder / "caches")})
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
        daemon.end()
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


class EngineProxy:
    """The Docker engine's socket seen through a path this test controls: taken away, the engine is 'down'
    for the daemon (it does not answer), while the real engine and its containers carry on."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self.server: socket.socket | None = None
        self.threads: list[threading.Thread] = []

    def up(self) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(64)
        thread = threading.Thread(target=self._accept, args=(self.server,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def down(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.path.unlink(missing_ok=True)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.target)
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for sock in (a, b):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def test_an_engine_that_does_not_answer_is_waited_for_and_sparkd_recovers_when_it_is_back(
        docker_daemon: Any, tmp_path: Path) -> None:
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    daemon = docker_daemon("docker-exec")
    daemon.config["restart"].update({"budget_failures": 3, "backoff_initial_s": 0.5, "backoff_max_s": 2})
    daemon.config_path.write_text(render_toml(daemon.config))
    daemon.start(env={"DOCKER_HOST": f"unix://{proxy.path}"})
    first = ready(daemon)
    proxy.down()
    os.kill(first["pid"], signal.SIGKILL)  # vLLM dies while the engine is away: every relaunch must wait
    waiting = daemon.wait_for(lambda s: (s.get("last_failure") or {}).get("class") == "host_unavailable", 90,
                              "the launch waits for the engine")
    time.sleep(6)  # several attempts while away: each at most 2 s apart, more than the budget of 3
    status = daemon.status()
    assert not status["breaker"]["open"] and status["state"] != "failed", status["last_failure"]
    assert waiting["launches"] >= 1
    proxy.up()
    again = ready(daemon, launches=2)
    assert again["pid"] != first["pid"] and not again["breaker"]["open"]
    # vLLM ended while the engine took no new connection: the engine's going away, not a failure of vLLM's
    lifecycle = json.loads((daemon.state_dir / "lifecycle.json").read_text())
    assert lifecycle["strikes"] == [], lifecycle
    proxy.down()


def test_a_drifted_container_is_reported_and_recreated(docker_daemon: Any, docker_client: Any) -> None:
    daemon = docker_daemon("docker-exec").start()
    ready(daemon)
    daemon.ctl("stop", "--wait")
    daemon.config["container"]["env"] = {"SPARKD_TEST_DRIFT": "1"}  # the existing container lacks it
    daemon.config_path.write_text(render_toml(daemon.config))
    assert daemon.ctl("reload").returncode == 0
    refused = daemon.ctl("start")
    assert refused.returncode == 0
    failed = daemon.wait_state("failed", timeout=60)
    assert "container.env" in failed["last_failure"]["message"], failed["last_failure"]
    assert "SPARKD_TEST_DRIFT" in daemon.ctl("status").stdout
    recreated = daemon.ctl("recreate")
    assert recreated.returncode == 0, recreated.stdout + recreated.stderr
    assert daemon.ctl("reset").returncode == 0
    daemon.ctl("start")
    now = ready(daemon, launches=2)
    env = docker_client.api.inspect_container(now["container_id"])["Config"]["Env"]
    assert "SPARKD_TEST_DRIFT=1" in env and not now.get("drift")
