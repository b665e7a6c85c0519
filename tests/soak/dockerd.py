"""The opt-in dockerd restart (``SOAK_DOCKERD=1``): a Docker engine of the soak's own, a third daemon that runs
the stand-in in a container of it (the docker-exec runtime), and a fault that restarts that engine.

The engine is private — its own data root, exec root, socket, containerd namespace and cgroup parent, no
bridge and no iptables rules — so the restart touches nothing of the machine's Docker engine, which other
programs use. It is still off by default: a second dockerd (with its containerd) on a shared CI machine is
not free. While the engine is down the daemon must wait (``host_unavailable``: no restart budget spent) and
recover by itself when it returns (issue 16, item 3), and the engine's going away counts nothing toward the
restart budget — not the vLLM its stop ended, not a launch it refused while shutting down.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import docker
from daemon_harness import STANDIN, Sparkd, base_config, title_prefix
from faults import Skipped
from freeport import free_port
from invariants import Ledger, Node, read_status
from soakpair import NOFILE, RECOVERY_S, RESTART, SoakPair

ENABLED = os.environ.get("SOAK_DOCKERD") == "1"
ENGINE_UP_S = 90.0


class PrivateEngine:
    """One dockerd of ours, started and ended by its PID."""

    def __init__(self, root: Path) -> None:
        self.root = root  # data root and config
        self.run = Path(f"/run/sparkd-soak-{os.getpid()}")  # exec root: sockets need a short path
        self.socket = self.run / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "dockerd.log"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        config = self.root / "daemon.json"
        config.write_text("{}\n")
        argv = ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.run),
                "--host", self.host, "--pidfile", str(self.run / "dockerd.pid"), "--config-file", str(config),
                "--bridge", "none", "--iptables=false", "--userland-proxy=false", "--storage-driver", "vfs",
                "--cgroup-parent", "sparkd-soak", "--containerd-namespace", "sparkd-soak",
                "--containerd-plugins-namespace", "sparkd-soak-plugins"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + ENGINE_UP_S
        while time.monotonic() < deadline:
            if self.answers():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise Skipped(f"a private dockerd did not come up: {self.log_path.read_text(errors='replace')[-600:]}")

    def answers(self) -> bool:
        try:
            with contextlib.closing(docker.DockerClient(base_url=self.host, timeout=5)) as client:
                return bool(client.ping())
        except Exception:
            return False

    def stop(self) -> None:
        """SIGTERM (dockerd stops its containers and its containerd), then SIGKILL after a minute."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def remove_containers(self, label: str) -> None:
        client = docker.DockerClient(base_url=self.host, timeout=30)
        with contextlib.suppress(Exception), contextlib.closing(client):
            for container in client.containers.list(all=True, filters={"label": label}):
                container.remove(force=True)

    def close(self, label: str) -> None:
        self.remove_containers(label)
        self.stop()
        netns = self.run / "netns" / "default"  # dockerd bind-mounts its network namespace here, and leaves it
        if os.path.ismount(netns):
            subprocess.run(["umount", "-l", str(netns)], capture_output=True, timeout=30)
        shutil.rmtree(self.run, ignore_errors=True)


class Solo:
    """The docker-exec daemon of the soak: one node (role single) whose vLLM runs in the private engine."""

    LABEL = "sparkd.soak"

    def __init__(self, tmp: Path) -> None:
        self.engine = PrivateEngine(tmp / "engine")
        self.engine.start()
        try:
            self.daemon = self._configure(tmp / "solo")
        except BaseException:
            self.engine.close(self.LABEL)
            raise

    def _configure(self, folder: Path) -> Sparkd:
        import build_image  # tests/infra: the test image, made here in the private engine

        with contextlib.closing(docker.DockerClient(base_url=self.engine.host, timeout=120)) as client:
            image = build_image.ensure_image(client)
        mounts = [{"source": src, "target": opt["bind"], "read_only": opt.get("mode") == "ro"}
                  for src, opt in build_image.python_mounts().items()]
        name = f"sparkd-soak-{uuid.uuid4().hex[:8]}"
        folder.mkdir(parents=True)
        cfg: dict[str, Any] = base_config(folder, free_port(), restart=RESTART, container={
            "name": name, "image": image, "mounts": mounts, "gpus": "", "host_ipc": True,
            "labels": {self.LABEL: "1"}})
        cfg["runtime"] = "docker-exec"
        cfg["node"]["name"] = name
        cfg["launch"]["executable"] = str(STANDIN)
        return Sparkd(folder, cfg)

    def start(self) -> None:
        self.daemon.start(env={"DOCKER_HOST": self.engine.host}, limit_fds=NOFILE)

    def node(self) -> Node:
        daemon = self.daemon
        return Node("solo", title_prefix(daemon.config)[:-2], daemon.state_dir / "status.json",
                    lambda: daemon.proc.pid if daemon.proc is not None and daemon.proc.poll() is None else None)

    def ready(self, other_than: int | None = None, timeout: float = RECOVERY_S) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.daemon.status()
            if (status.get("state") == "ready" and status.get("pid") not in (None, other_than)
                    and self.daemon.proc is not None and status.get("daemon_pid") == self.daemon.proc.pid):
                return status
            if self.daemon.proc is None or self.daemon.proc.poll() is not None:
                return None
            time.sleep(0.25)
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.daemon.stop(timeout=120)
        self.daemon.kill()
        self.engine.close(self.LABEL)


def dockerd_restart(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """The private engine stopped (its containers with it), down ``down_s``, started again; the docker-exec
    daemon must wait while it is down and be ready again, with a new vLLM, once it is back."""
    solo: Solo | None = getattr(pair, "solo", None)
    if solo is None:
        raise Skipped("no docker-exec daemon (SOAK_DOCKERD=1 runs one)")
    before = solo.daemon.status()
    counted = len(_strikes(solo))
    solo.engine.stop()
    time.sleep(params["down_s"])
    waiting = solo.daemon.status()
    failure = waiting.get("last_failure") or {}
    if waiting.get("state") == "failed":
        ledger.add("the docker-exec daemon opened its breaker while the Docker engine was down",
                   str(failure.get("message")))
    solo.engine.start()
    after = solo.ready(other_than=before.get("pid"))
    spent = _strikes(solo)[counted:]
    if spent:  # the vLLM the engine's stop ended included: the engine went away, nothing failed
        ledger.add("the Docker engine's restart was counted toward the restart budget",
                   f"failures counted: {[s.get('class') for s in spent]}")
    if after is None:
        ledger.add("the docker-exec daemon was not ready again within the bound after the Docker engine returned",
                   str(solo.daemon.status().get("last_failure")))
        return f"engine down {params['down_s']} s: not ready again"
    return (f"engine down {params['down_s']} s (meanwhile {waiting.get('state')}, {failure.get('class')}); "
            f"ready again, pid {before.get('pid')} → {after.get('pid')}, {len(spent)} failures counted")


def _strikes(solo: Solo) -> list[dict[str, Any]]:
    """The failures the docker-exec daemon's restart budget holds now (its lifecycle.json)."""
    lifecycle, _ = read_status(solo.node().lifecycle_path)
    return list((lifecycle or {}).get("strikes") or [])
