"""Root writes only where it means to (security review §3 and §5), each attack of the review replayed on real
files: a FIFO or a link at the launch script's temp name, ``vllm.log`` and ``vllm.out`` as links, ``incidents`` as a
link to a directory of someone else's folders, a container's log as a link to a host file. Each finds nothing to
write (or read) through. tests/integration/test_file_attacks.py replays them against a running daemon."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkd.host.logs import Rotation, VllmLog
from sparkd.host.safefile import create_new, fresh_file, open_append
from sparkd.runtime import inroot
from sparkd.runtime.inroot import open_in_root, open_log
from sparkd.runtime.process import write_atomic
from sparkd.state.files import write_json
from sparkd.state.incidents import UnsafeRoot, incident_record, list_incidents, prune, write_incident
from sparkd.supervisor.failures import Evidence, Failure, FailureClass


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __getattr__(self, level: str) -> object:
        return lambda event, **kw: self.events.append((event, kw))


def planted_fifo(path: Path) -> Path:
    os.mkfifo(path, 0o600)
    return path


def test_the_launch_script_is_never_written_through_a_planted_fifo_or_link(tmp_path: Path) -> None:
    """The review's root shell: `.launch.sh.tmp` a FIFO; sparkd wrote the script into it and chmod'ed it 0755."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    fifo = planted_fifo(tmp_path / ".launch.sh.tmp")
    pid_fifo = planted_fifo(tmp_path / f".launch.sh.{os.getpid()}.tmp")
    (tmp_path / "launch.sh").symlink_to(victim)
    write_atomic(tmp_path / "launch.sh", "#!/bin/bash\necho hi\n", 0o750)
    script = tmp_path / "launch.sh"
    assert not script.is_symlink() and script.read_text() == "#!/bin/bash\necho hi\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert victim.read_text() == "untouched\n"
    for planted in (fifo, pid_fifo):
        assert stat.S_ISFIFO(planted.lstat().st_mode) and stat.S_IMODE(planted.lstat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".launch.sh.tmp", f".launch.sh.{os.getpid()}.tmp", "launch.sh", "victim"])  # no temp file left


def test_state_files_and_new_files_refuse_any_name_taken_by_a_link_or_fifo(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "status.json").symlink_to(victim)
    write_json(tmp_path / "status.json", {"state": "ready"})
    assert victim.read_text() == "untouched\n" and not (tmp_path / "status.json").is_symlink()
    assert stat.S_IMODE((tmp_path / "status.json").stat().st_mode) == 0o640
    for taken in ((tmp_path / "link"), planted_fifo(tmp_path / "fifo")):
        if taken.name == "link":
            taken.symlink_to(victim)
        with pytest.raises(FileExistsError):
            create_new(taken, b"x")
    assert victim.read_text() == "untouched\n"


def test_vllm_log_as_a_link_or_a_fifo_is_refused_and_never_written_through(tmp_path: Path) -> None:
    """The review: `logs/vllm.log → fake-etc/vllmlog` (root 0600), and root appended vLLM's output there."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    for planted in ("link", "fifo"):
        path = tmp_path / f"{planted}.log"
        path.symlink_to(victim) if planted == "link" else planted_fifo(path)
        rec = Recorder()
        log = VllmLog(path, Rotation(1 << 20, 1), retry_s=60, log=rec)
        started = time.monotonic()
        for n in range(3):
            log.append(f"secret line {n}")
        assert time.monotonic() - started < 1.0  # a FIFO without a reader never blocks the writer
        assert log.write_error is not None and log.lost_lines == 3, planted
        assert [event for event, _ in rec.events] == ["vllm_log_write_failed"]
        assert log.last(3) == [f"secret line {n}" for n in range(3)]  # the ring still has them
        log.close()
    assert victim.read_text() == "untouched\n"
    with pytest.raises(OSError) as refused:
        open_append(tmp_path / "link.log")
    assert refused.value.errno == errno.ELOOP


def test_a_fresh_raw_log_replaces_a_planted_link_and_leaves_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "vllm.out").symlink_to(victim)
    fd = fresh_file(tmp_path / "vllm.out")
    os.write(fd, b"vllm output\n")
    os.close(fd)
    assert victim.read_text() == "untouched\n" and (tmp_path / "vllm.out").read_text() == "vllm output\n"


def record(cls: str = "oom", at: float = 1_700_000_000.0) -> dict[str, object]:
    return incident_record(Failure.of(FailureClass(cls), "it broke"), at=at, config_hash="h")


def someone_elses(folder: Path, n: int = 5) -> list[str]:
    folder.mkdir()
    names = [f"sysdir{i:02d}" for i in range(n)]
    for name in names:
        (folder / name).mkdir()
        (folder / name / "keep").write_text("x")
    return names


def test_an_incidents_root_that_is_a_link_is_refused_and_nothing_there_is_removed(tmp_path: Path) -> None:
    """The review: `incidents → fake-etc/incdir`, one crash later the pruner had rmtree'd sysdir01-05."""
    other = tmp_path / "other"
    names = someone_elses(other, 55)
    (tmp_path / "incidents").symlink_to(other)
    with pytest.raises(UnsafeRoot, match="is a symlink"):
        write_incident(tmp_path / "incidents", record(), log_tail=["x"], evidence=frozenset(), keep=50)
    prune(tmp_path / "incidents", 0)
    assert sorted(p.name for p in other.iterdir()) == names
    assert list_incidents(tmp_path / "incidents") == []


def test_the_pruner_removes_only_its_own_folders(tmp_path: Path) -> None:
    root = tmp_path / "incidents"
    elsewhere = tmp_path / "elsewhere"
    foreign = someone_elses(elsewhere, 3)
    written = [write_incident(root, record(at=1_700_000_000.0 + i), log_tail=["x"], evidence=frozenset(), keep=50)
               for i in range(3)]
    (root / "20000101T000000Z-oom").symlink_to(elsewhere)  # an old name of the pattern, as a link
    (root / "aaa-not-ours").mkdir()
    prune(root, 1)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["20000101T000000Z-oom", "aaa-not-ours", written[-1].name])
    assert sorted(p.name for p in elsewhere.iterdir()) == foreign
    assert [r["path"] for r in list_incidents(root)] == [str(written[-1])]


def test_evidence_files_are_created_fresh_and_private(tmp_path: Path) -> None:
    folder = write_incident(tmp_path / "incidents", record(), log_tail=["a", "b"],
                            evidence=frozenset({Evidence.meminfo, Evidence.container}), container={"Id": "c"})
    for name in ("incident.json", "log-tail.txt", "meminfo.txt", "container.json"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o640, name
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750


@pytest.fixture
def container_root(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A chrooted process standing in for a container's init: its /tmp/sparkd-vllm.log → /etc/hostname."""
    root = tmp_path / "rootfs"
    (root / "tmp").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("the-container\n")
    (root / "tmp" / "sparkd-vllm.log").symlink_to("/etc/hostname")
    proc = subprocess.Popen([sys.executable, "-c", f"import os, time; os.chroot({str(root)!r}); print(1, flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
    yield root, proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_a_containers_log_link_resolves_inside_the_container_never_on_the_host(
        container_root: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's proof: through /proc/<pid>/root a plain open() follows an absolute link to the host's file."""
    root, pid = container_root
    host_path = f"/proc/{pid}/root/tmp/sparkd-vllm.log"
    host_hostname = Path("/etc/hostname").read_text() if Path("/etc/hostname").exists() else None
    if host_hostname is not None:
        assert Path(host_path).read_text() == host_hostname  # the attack, as the review saw it
    handle = open_log(host_path)
    assert handle is not None and handle.read() == b"the-container\n"  # the container's own file, or nothing
    handle.close()
    fd = open_in_root(f"/proc/{pid}/root", "/tmp/../../../etc/hostname")
    assert os.read(fd, 100) == b"the-container\n"  # `..` stops at the container's root
    os.close(fd)
    # Without openat2 (a kernel before 5.6), no link on the way is followed at all.
    monkeypatch.setattr(inroot, "openat2", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSYS, "ENOSYS")))
    assert open_log(host_path) is None
    (root / "tmp" / "sparkd-vllm.log").unlink()
    (root / "tmp" / "sparkd-vllm.log").write_text("vllm says hi\n")
    handle = open_log(host_path)
    assert handle is not None and handle.read() == b"vllm says hi\n"
    handle.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_a_containers_log_that_is_a_fifo_or_a_directory_is_not_opened(container_root: tuple[Path, int]) -> None:
    root, pid = container_root
    (root / "tmp" / "sparkd-vllm.log").unlink()
    os.mkfifo(root / "tmp" / "sparkd-vllm.log")
    started = time.monotonic()
    assert open_log(f"/proc/{pid}/root/tmp/sparkd-vllm.log") is None
    assert time.monotonic() - started < 1.0
