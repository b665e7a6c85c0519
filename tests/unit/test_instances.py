"""The host's instance registry (sparkd.instances): what one sparkd writes, what another reads, and that a
registration whose daemon is gone, or a file that is not one, protects nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sparkd import instances
from sparkd.instances import Registration


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
