"""The host's instance registry (sparkd.preflight.instances): what one sparkd writes, what another reads, and that a
registration whose daemon is gone, or a file that is not one, protects nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparkd.config import config_from_mapping
from sparkd.daemon.effects.registry import InstanceRegistry
from sparkd.preflight import instances
from sparkd.preflight.instances import Registration


@pytest.fixture
def daemon() -> Iterator[psutil.Process]:
    """A live process standing in for another sparkd daemon."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def registration(daemon: psutil.Process, state: str, **launch: object) -> Registration:
    return Registration(daemon_pid=daemon.pid, daemon_start=daemon.create_time(), state_dir=state,
                        config=f"{state}/sparkd.toml", node="b", **launch)  # type: ignore[arg-type]


def test_a_live_instances_launch_is_read_by_the_others(tmp_path: Path, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    reg = registration(daemon, "/var/lib/sparkd-b", launch_pid=4321, launch_start=12.5, marker="m-b",
                       container="vllm_b")
    instances.write(folder, reg)
    found = instances.live(folder, besides=Path("/var/lib/sparkd-a"))
    assert found == [reg]
    (launch,) = instances.launches(found)
    assert (launch.pid, launch.start, launch.marker) == (4321, 12.5, "m-b")
    assert launch.owner == "sparkd instance b (config /var/lib/sparkd-b/sparkd.toml, state /var/lib/sparkd-b)"
    assert instances.live(folder, besides=Path("/var/lib/sparkd-b")) == []  # its own is not a neighbour's


def test_a_registration_whose_daemon_is_gone_protects_nothing(tmp_path: Path, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    instances.write(folder, registration(daemon, "/s/b", launch_pid=4321, launch_start=1.0))
    reused = Registration(daemon_pid=daemon.pid, daemon_start=daemon.create_time() - 100, state_dir="/s/c",
                          launch_pid=99, launch_start=1.0)  # its PID now belongs to another process
    instances.write(folder, reused)
    assert [r.state_dir for r in instances.live(folder)] == ["/s/b"]
    daemon.kill()
    daemon.wait(10)
    assert instances.live(folder) == []


def test_nothing_launched_is_no_launch(daemon: psutil.Process) -> None:
    assert registration(daemon, "/s/b").launch() is None


def test_a_daemon_removes_only_its_own_registration(tmp_path: Path, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    instances.write(folder, registration(daemon, "/s/b"))
    instances.remove(folder, Path("/s/b"), daemon_pid=os.getpid())  # not ours: stays
    assert instances.file_for(folder, Path("/s/b")).exists()
    instances.remove(folder, Path("/s/b"), daemon_pid=daemon.pid)
    assert not instances.file_for(folder, Path("/s/b")).exists()


@pytest.mark.parametrize("bad", ["not json", '{"daemon_pid": "x"}', "[1, 2]", '{"daemon_pid": 1, '
                                 '"daemon_start": 0, "state_dir": "/"}', "x" * (70 << 10)])
def test_a_file_that_is_not_a_registration_is_skipped(tmp_path: Path, bad: str, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    instances.write(folder, registration(daemon, "/s/b"))
    (folder / "0000000000000000.json").write_text(bad)
    assert [r.state_dir for r in instances.live(folder)] == ["/s/b"]


def test_a_symlink_or_a_folder_is_never_read_as_a_registration(tmp_path: Path, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    instances.write(folder, registration(daemon, "/s/b"))
    target = instances.file_for(folder, Path("/s/b"))
    os.rename(target, tmp_path / "elsewhere.json")
    target.symlink_to(tmp_path / "elsewhere.json")
    (folder / "dir.json").mkdir()
    assert instances.live(folder) == []


def test_a_folder_others_may_write_to_is_refused(tmp_path: Path, daemon: psutil.Process) -> None:
    folder = tmp_path / "instances"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(OSError, match="not owned by uid"):
        instances.write(folder, registration(daemon, "/s/b"))
    assert list(folder.iterdir()) == []


# ---- where a registration goes, and where instances read them ----------------------------------------------------


def test_every_instance_reads_the_configured_folder_its_users_and_every_users(tmp_path: Path) -> None:
    runtime_root = tmp_path / "run-user"
    for uid in ("1000", "1001"):
        (runtime_root / uid).mkdir(parents=True)
    configured = tmp_path / "instances"
    found = instances.folders(configured, {"XDG_RUNTIME_DIR": str(runtime_root / "1000")}, runtime_root)
    assert found == [configured, runtime_root / "1000/sparkd/instances", runtime_root / "1001/sparkd/instances"]
    assert instances.folders(configured, {"XDG_RUNTIME_DIR": "relative"}, tmp_path / "none") == [configured]


def test_a_users_folder_speaks_only_for_that_users_processes(tmp_path: Path, daemon: psutil.Process) -> None:
    """Read by root, a registration in a folder of uid 1000 protects only uid 1000's processes; one in a folder
    of root's protects whatever its launch is (a container's processes run as any uid)."""
    users, roots = tmp_path / "user" / "instances", tmp_path / "root" / "instances"
    for folder, reg in ((users, registration(daemon, "/s/u", marker="m-u")),
                        (roots, registration(daemon, "/s/r", marker="m-r"))):
        instances.write(folder, reg)
    os.chown(users, 1000, 1000)
    (user_launch,) = instances.launches(instances.live(users))
    (root_launch,) = instances.launches(instances.live(roots))
    assert (user_launch.marker, user_launch.uid) == ("m-u", 1000)
    assert (root_launch.marker, root_launch.uid) == ("m-r", None)
    link = tmp_path / "link"
    link.symlink_to(users)
    assert instances.live(link) == []  # a folder reached through a symlink is not read


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []

    def info(self, event: str, **kw: object) -> None:
        self.events.append(("info", event, kw))

    def warning(self, event: str, **kw: object) -> None:
        self.events.append(("warning", event, kw))


def registry(tmp_path: Path, configured: Path, env: dict[str, str]) -> tuple[InstanceRegistry, Log]:
    paths = {"state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run"), "instances_dir": str(configured)}
    cfg = config_from_mapping({"runtime": "process", "node": {"name": "demo", "role": "single"},
                               "launch": {"model": "m"}, "paths": paths}, env={})
    log = Log()
    return InstanceRegistry(lambda: cfg, tmp_path / "demo.toml", log, env=env), log


def test_a_daemon_that_may_not_write_the_configured_folder_registers_in_its_users_once_noted(
        tmp_path: Path) -> None:
    configured = tmp_path / "instances"
    configured.mkdir(mode=0o777)
    configured.chmod(0o777)  # not this daemon's alone (as /run/sparkd is not a user's): refused
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    reg, log = registry(tmp_path, configured, {"XDG_RUNTIME_DIR": str(runtime)})
    for _ in range(3):  # at start, then every minute
        reg.write()
    user_folder = runtime / "sparkd" / "instances"
    assert [r.state_dir for r in instances.live(user_folder)] == []  # our own daemon: never a neighbour
    written = instances.read(instances.file_for(user_folder, tmp_path / "state"))
    assert written is not None and written.node == "demo"
    assert [(level, event) for level, event, _ in log.events] == [("info", "registration_in_user_folder")]
    assert "not owned by uid" in str(log.events[0][2]["because"])
    configured.chmod(0o755)  # the folder becomes ours: the registration moves there
    reg.write()
    assert instances.file_for(configured, tmp_path / "state").exists()
    assert not instances.file_for(user_folder, tmp_path / "state").exists()
    reg.remove()
    assert not instances.file_for(configured, tmp_path / "state").exists()


def test_a_daemon_that_can_register_nowhere_warns_once(tmp_path: Path) -> None:
    configured = tmp_path / "instances"
    configured.mkdir()
    configured.chmod(0o777)
    reg, log = registry(tmp_path, configured, {})
    for _ in range(3):
        reg.write()
    assert [(level, event) for level, event, _ in log.events] == [("warning", "registration_failed")]
    assert "XDG_RUNTIME_DIR" in str(log.events[0][2]["hint"])
    reg.remove()  # nothing written: nothing to remove, no error
