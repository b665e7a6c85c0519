"""Issue 23's proof on the real host: sparkd instance B starts, restarts, stops, is SIGKILLed and restarted beside
neighbours that all carry vLLM's default ``VLLM::`` titles — instance A (a sparkd daemon, serving), a stand-in
tree started by hand with a live API server, and a stand-in in a Docker container started outside sparkd — and
the field's litter: the orphans of a stand-in whose API server was SIGKILLed (its worker holding the master port
B needs, their ``psm_*`` segments in /dev/shm). Every neighbour keeps every PID (A's restarts stay 0); the litter
is ended and its segments removed. With the process runtime and with docker-run. And a neighbour holding B's API
port is named: PID, command line, container, owning sparkd instance.

The neighbours are made once for the module (the slow part) and checked after every step of each runtime."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import BIN, MODEL, STANDIN, Sparkd, alive, base_config, kill_tree, tree, unique_prefix
from freeport import free_port
from waiting import until

from sparkd.preflight import instances

pytestmark = pytest.mark.docker

STANDIN_ENV = {"SPARKD_STANDIN_STARTUP_SECONDS": "0.5", "PYTHONUNBUFFERED": "1"}  # and vLLM's default titles


def identities(pid: int) -> set[tuple[int, float]]:
    """The tree under ``pid``, each process by PID and create time."""
    return {(p.pid, p.create_time()) for p in alive(tree(pid))}


def titled_members(pid: int, prefix: str = "VLLM::") -> list[str]:
    titles = []
    for p in alive(tree(pid)):
        with contextlib.suppress(psutil.Error):
            if p.cmdline() and p.cmdline()[0].startswith(prefix):
                titles.append(p.cmdline()[0])
    return titles


def default_titles(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg["launch"]["env"].pop("VLLM_PROCESS_NAME_PREFIX", None)
    return cfg


def standin_argv(port: int, *, master_port: int | None = None) -> list[str]:
    argv = [str(STANDIN), "serve", MODEL, "--served-model-name", "test-model", "--host", "127.0.0.1",
            "--port", str(port)]
    if master_port is not None:  # the head of a two-node world of one: its worker binds the master port
        argv += ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    return argv


def health(port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)  # one slow answer under load is no dead neighbour
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def hand_started(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    inherited = {k: v for k, v in os.environ.items() if k != "VLLM_PROCESS_NAME_PREFIX"}
    return subprocess.Popen(argv, env={**inherited, **STANDIN_ENV, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


@dataclass
class Neighbours:
    tmp: Path
    instances: Path  # the registry every sparkd of this test shares
    a: Sparkd
    hand: subprocess.Popen[bytes]
    hand_port: int
    container: Any
    container_port: int
    docker_client: Any
    test_image: str
    mounts: list[dict[str, Any]]
    labels: dict[str, str]
    before: dict[str, set[tuple[int, float]]] = field(default_factory=dict)

    def trees(self) -> dict[str, set[tuple[int, float]]]:
        self.container.reload()
        return {"A": identities(int(self.a.status()["pid"])), "hand-started": identities(self.hand.pid),
                "container": identities(int(self.container.attrs["State"]["Pid"]))}

    def check(self, step: str) -> None:
        """Every neighbour keeps every PID; A stays ready with no restart."""
        now = self.trees()
        for name, members in self.before.items():
            assert now[name] == members, f"after {step}: {name}'s processes changed: {members - now[name]} gone"
        status = self.a.status()
        assert status["state"] == "ready" and status["restarts"] == 0 and status["launches"] == 1, (step, status)
        assert health(self.hand_port) and health(self.container_port), step


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory, docker_client: Any, test_image: str,
               python_mounts: dict[str, dict[str, str]], docker_test_labels: dict[str, str]) -> Iterator[Neighbours]:
    tmp = tmp_path_factory.mktemp("neighbours")
    instances = tmp / "instances"
    (tmp / "a").mkdir()
    # A is watched for being left alone, not for its hang detection: the harness's 3 s stall (a small machine's
    # floor) read a loaded host's slow stand-in as a wedge once beside the whole suite, and A was restarted.
    a = Sparkd(tmp / "a", default_titles(base_config(tmp / "a", free_port(), paths={"instances_dir": str(instances)},
                                                     health={"canary_timeout_s": 30, "stall_after_s": 30})))
    hand_port, container_port = free_port(), free_port()
    mounts = [{"source": src, "target": opt["bind"], "read_only": opt.get("mode") == "ro"}
              for src, opt in python_mounts.items()]
    a.start()  # first: its own preflight is not what is under test
    hand, container = None, None
    try:
        a.wait_state("ready", timeout=120)
        hand = hand_started(standin_argv(hand_port))
        container = docker_client.containers.run(
            test_image, standin_argv(container_port), detach=True, network_mode="host", labels=docker_test_labels,
            name=f"n23-neighbour-{uuid.uuid4().hex[:8]}", volumes=python_mounts, environment=STANDIN_ENV)
        until(lambda: health(hand_port) and health(container_port), "the hand-started and the container's "
              "stand-ins serving", 120)
        found = Neighbours(tmp, instances, a, hand, hand_port, container, container_port, docker_client,
                           test_image, mounts, docker_test_labels)
        until(lambda: all(titled_members(pid) for pid in (int(a.status()["pid"]), hand.pid)),
              "every neighbour's engine titled VLLM::EngineCore", 60)
        found.before = found.trees()
        assert all(len(members) >= 3 for members in found.before.values()), found.before
        yield found
    finally:
        a.end()
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        if hand is not None:
            kill_tree(alive(tree(hand.pid)))
            hand.wait(10)


def litter(master_port: int) -> tuple[list[psutil.Process], set[str]]:
    """The field's litter: a stand-in (default titles, a two-node head, so its worker binds ``master_port``)
    whose API server is SIGKILLed; its engine and worker live on, with their /dev/shm segments."""
    port = free_port()
    server = hand_started(standin_argv(port, master_port=master_port), SPARKD_STANDIN_ORPHAN_ON_KILL="1")
    until(lambda: health(port), "the soon-orphaned stand-in serving", 60)
    children = [p for p in alive(tree(server.pid)) if p.pid != server.pid]
    direct = [p for p in children if p.ppid() == server.pid]
    segments = held_segments(children)
    assert segments, "the stand-in's engine holds no psm_* segment"
    server.kill()
    server.wait(10)
    until(lambda: all(p.ppid() == 1 for p in alive(direct)), "the orphans re-parented to init", 10)
    titles = {p.cmdline()[0] for p in alive(children)}
    assert "VLLM::EngineCore" in titles and any(t.startswith("VLLM::Worker") for t in titles), titles
    with socket.socket() as sock, pytest.raises(OSError):  # the orphaned worker holds the master port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", master_port))
    return children, segments


def held_segments(procs: list[psutil.Process]) -> set[str]:
    names = set()
    for proc in procs:
        for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("/dev/shm/psm_"):
                    names.add(target.removeprefix("/dev/shm/"))
        for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines():
            if "/dev/shm/psm_" in line:
                names.add(line.split("/dev/shm/", 1)[1].removesuffix(" (deleted)"))
    return names


def instance_b(nb: Neighbours, runtime: str, master_port: int) -> Sparkd:
    folder = nb.tmp / f"b-{runtime}"
    folder.mkdir()
    cfg = default_titles(base_config(folder, free_port(), paths={"instances_dir": str(nb.instances)},
                                     node={"role": "head"}))
    cfg["launch"] |= {"nnodes": 2, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": master_port}
    if runtime != "process":  # docker-exec: its long-lived container runs `sleep infinity`, an init that adopts
        cfg["runtime"] = runtime
        cfg["container"] = {"name": f"n23-b-{uuid.uuid4().hex[:8]}", "image": nb.test_image, "mounts": nb.mounts,
                            "gpus": "", "host_ipc": True, "labels": nb.labels,
                            "compile_cache_dir": str(folder / "caches")}
    return Sparkd(folder, cfg)


def remove_container(nb: Neighbours, daemon: Sparkd) -> None:
    """B's container, if it has one left (docker-exec's outlives its daemon)."""
    name = daemon.config.get("container", {}).get("name")
    if name:
        with contextlib.suppress(Exception):
            nb.docker_client.containers.get(name).remove(force=True)


@pytest.mark.parametrize("runtime", ["process", "docker-run", "docker-exec"])
def test_instance_b_lives_beside_its_neighbours_and_clears_only_the_litter(neighbours: Neighbours,
                                                                          runtime: str) -> None:
    nb = neighbours
    nb.check("the neighbours' start")
    master_port = free_port()
    orphans, segments = litter(master_port)
    b = instance_b(nb, runtime, master_port)
    seen: list[psutil.Process] = []
    try:
        b.start()
        first = b.wait_for(lambda s: s.get("state") == "ready", 120, "B ready")
        seen += tree(first["pid"])
        assert alive(orphans) == [], "the litter outlived B's preflight"
        assert not any(Path("/dev/shm", name).exists() for name in segments), "the litter's segments are left"
        nb.check("B's start")
        assert b.ctl("restart", "--wait").returncode == 0
        second = b.wait_for(lambda s: s.get("state") == "ready" and s.get("launches") == 2, 120, "B restarted")
        seen += tree(second["pid"])
        nb.check("B's restart")
        assert b.ctl("stop").returncode == 0
        b.wait_state("stopped", timeout=60)
        nb.check("B's stop")
        assert b.ctl("start").returncode == 0
        third = b.wait_for(lambda s: s.get("state") == "ready" and s.get("launches") == 3, 120, "B started again")
        seen += tree(third["pid"])
        b.kill()  # SIGKILL: B's vLLM lives on, its registration protects nothing now
        nb.check("B's SIGKILL")
        b.start()
        adopted = b.wait_for(lambda s: s.get("state") == "ready" and s.get("daemon_pid") == b.proc.pid, 120,
                             "B's new daemon ready")
        assert adopted["pid"] == third["pid"], "B's new daemon adopted its vLLM"
        nb.check("B's restart after its SIGKILL")
        assert b.stop() == 0
        nb.check("B's exit")
    finally:
        b.end()
        kill_tree(alive(seen + orphans))
        remove_container(nb, b)


def stale_line(daemon: Sparkd) -> str:
    """``sparkd preflight --check stale_processes`` for ``daemon``'s config (the sweep is real, not a dry run)."""
    result = subprocess.run([str(BIN / "sparkd"), "preflight", "--config", str(daemon.config_path), "--check",
                             "stale_processes"], capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stdout.splitlines() if "stale_processes" in line]
    assert result.returncode == 0 and lines, result.stdout + result.stderr
    return lines[0]


def test_a_live_instances_orphans_are_left_to_it_until_its_sparkd_is_gone(neighbours: Neighbours) -> None:
    """Instance C serves; its daemon is frozen (SIGSTOP: alive and registered, but it cannot react) and its vLLM's
    API server SIGKILLed: the engine and worker are orphans under init, stale by the orphan rule alone. B's
    preflight leaves them, for they carry the launch marker of C's live registration. Once C's daemon is
    SIGKILLed too its registration (the file stays) protects nothing, and B's next preflight ends them."""
    nb = neighbours
    prefix = unique_prefix()  # C's and B's: no other session's sweep reaches C's orphans meanwhile
    made = []
    for name, env in (("c", {"SPARKD_STANDIN_ORPHAN_ON_KILL": "1"}), ("b-sweeps", {})):
        (nb.tmp / name).mkdir()
        made.append(Sparkd(nb.tmp / name, base_config(nb.tmp / name, free_port(), paths={
            "instances_dir": str(nb.instances)}, launch={"env": {**env, "VLLM_PROCESS_NAME_PREFIX": prefix}})))
    c, b = made
    family: list[psutil.Process] = []
    try:
        server = psutil.Process(c.start().wait_state("ready", timeout=120)["pid"])
        until(lambda: titled_members(server.pid, f"{prefix}::"), "C's engine titled", 60)
        family = alive(tree(server.pid))
        orphans = [p for p in family if p.pid != server.pid and p.status() != psutil.STATUS_ZOMBIE]
        direct = [p for p in orphans if p.ppid() == server.pid]
        c.signal(signal.SIGSTOP)
        server.kill()
        until(lambda: all(p.ppid() == 1 for p in alive(direct)), "C's orphans re-parented to init", 10)
        titled = [p for p in orphans if p.cmdline()[0].startswith(f"{prefix}::")]  # (the rest is vLLM's helpers)
        assert f"{prefix}::EngineCore" in {p.cmdline()[0] for p in titled}
        kept = stale_line(b)
        assert alive(orphans) == orphans and "ended" not in kept, kept
        c.kill()  # a stopped daemon takes SIGKILL: gone now, its registration left behind
        assert instances.file_for(nb.instances, c.state_dir).exists()
        swept = stale_line(b)
        assert f"ended {len(titled)} process(es)" in swept, swept
        assert alive(titled) == []
        nb.check("C's orphans, left while C lived, ended once it was gone")
    finally:
        with contextlib.suppress(Exception):
            c.signal(signal.SIGCONT)  # a frozen daemon would not take the SIGTERM of its end
        c.end()
        kill_tree(alive(family))


def test_a_neighbour_holding_the_port_is_named_and_left_alone(neighbours: Neighbours) -> None:
    """B configured onto the API port of each neighbour in turn: preflight fails (and --dry-run says the same)
    naming the holder's PID and command line, its container, and the sparkd instance whose launch it is."""
    nb = neighbours
    a_status = nb.a.status()
    cases = {
        nb.hand_port: (f"PID {nb.hand.pid} (", f"{STANDIN} serve {MODEL}"),
        nb.container_port: (f"{STANDIN} serve {MODEL}", f"in container {nb.container.name}"),
        int(nb.a.config["launch"]["port"]): (f"PID {a_status['pid']} (", f"of sparkd instance test (config "
                                             f"{nb.a.config_path}, state {nb.a.state_dir})"),
    }
    for port, words in cases.items():
        folder = nb.tmp / f"holder-{port}"
        folder.mkdir()
        b = Sparkd(folder, default_titles(base_config(folder, port, paths={"instances_dir": str(nb.instances)})))
        for extra in ((), ("--dry-run",)):
            result = subprocess.run([str(BIN / "sparkd"), "preflight", "--config", str(b.config_path), *extra],
                                    capture_output=True, text=True, timeout=120)
            ports = [line for line in result.stdout.splitlines() if " ports " in f" {line} "]
            assert result.returncode == 1 and ports, (extra, result.stdout, result.stderr)
            assert all(w in ports[0] for w in words), (words, ports[0])
            assert "not a stale vLLM process" in ports[0], ports[0]
    assert nb.a.status()["pid"] == a_status["pid"]
    # sparkctl asks A's daemon for the same checks: the neighbours (and B's instances) are nothing stale to A
    dry = nb.a.ctl("preflight", "--dry-run")
    assert dry.returncode == 0 and "no stale vLLM process" in dry.stdout, dry.stdout + dry.stderr
    nb.check("three preflights onto the neighbours' ports, and sparkctl preflight --dry-run")
