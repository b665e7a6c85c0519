"""State files on filesystems that refuse writes: a real 64 KiB tmpfs filled to the last byte, and a read-only
bind mount (reliability.md scenario 4). Writes fail without raising, are logged once per episode, leave no
temp file, keep the last good file intact, and recover by themselves once the space (or write access) is back.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkd.state.files import json_state
from sparkd.state.schema import INSTANCE, STATUS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")

RECORD = {"runtime": "process", "pid": 4242, "create_time": 1700000000.5, "config_hash": "abc"}


class Events:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((event, kw))


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "state"
    where.mkdir()
    mount("-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)


def fill(folder: Path) -> Path:
    """Fill the filesystem: write until ENOSPC. Returns the filler (remove it to free the space)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc
    finally:
        os.close(fd)
    return filler


def test_a_full_state_filesystem_fails_writes_quietly_and_recovers(small_tmpfs: Path) -> None:
    events = Events()
    status = json_state(small_tmpfs / "status.json", STATUS, log=events)
    first = {"state": "ready", "pid": 4242, "padding": "x" * 2000}
    assert status.write(first).ok
    filler = fill(small_tmpfs)
    results = [status.write({"state": "degraded", "pid": 4242, "padding": "y" * 8000}) for _ in range(20)]
    assert not any(r.ok for r in results) and [r.started for r in results].count(True) == 1
    assert not status.healthy and "No space left on device" in (status.problem or "")
    assert [e for e, _ in events.lines] == ["state_write_failed"]
    assert json.loads(status.path.read_text()) == first  # the last good file is intact
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler", "status.json"]  # no temp file left
    filler.unlink()
    result = status.write({"state": "ready", "pid": 4242})
    assert result.ok and result.recovered and status.healthy
    assert [e for e, _ in events.lines] == ["state_write_failed", "state_write_recovered"]
    assert events.lines[1][1]["failed_writes"] == 20


def test_a_read_only_state_folder_fails_writes_and_bad_files_stay_in_place(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "instance.json").write_text('{"runtime": "process"}')
    mount("--bind", str(folder), str(folder))
    try:
        mount("-o", "remount,ro,bind", str(folder))
        events = Events()
        record = json_state(folder / "instance.json", INSTANCE, log=events)
        assert record.read() is None  # bad shape: treated as absent although it cannot be moved
        assert (folder / "instance.json").exists()
        [(event, kw)] = events.lines
        assert event == "state_file_bad" and kw["set_aside"] is None and "pid: missing" in kw["reason"]
        result = record.write(RECORD)
        assert not result.ok and "Read-only file system" in (result.problem or "")
        assert not record.remove().ok and record.write(RECORD).started is False
        mount("-o", "remount,rw,bind", str(folder))
        assert record.write(RECORD).recovered and record.read() == RECORD
    finally:
        subprocess.run(["umount", str(folder)], check=True, timeout=30)
    assert json.loads((folder / "instance.json").read_text()) == RECORD
