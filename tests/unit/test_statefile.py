"""State files: every shape a record can be found in (reliability.md 3a-3c, 3f), set aside and never fatal."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkd.state.files import StateFile, json_state, read_json, remove_dead_temps, set_aside, to_json, write_json
from sparkd.state.schema import INSTANCE, LIFECYCLE, SHM_LEDGER, STATUS, BadShape

GOOD_INSTANCE = {"runtime": "process", "pid": 4242, "create_time": 1700000000.5, "config_hash": "abc",
                 "container_id": None, "exec_id": None, "log_path": "/x/vllm.out", "extra": {}}


class Events:
    """Collects what a StateFile logs (a structlog-shaped sink)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))

    def __getattr__(self, level: str) -> Any:
        return self._add(level)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.lines]


def instance_file(tmp_path: Path, events: Events | None = None, clock: float = 1_700_000_000.0
                  ) -> StateFile[dict[str, Any]]:
    return json_state(tmp_path / "instance.json", INSTANCE, log=events or Events(), clock=lambda: clock)


@pytest.mark.parametrize("content, why", [
    (b"", "not JSON"),
    (random.Random(44).randbytes(64).replace(b"{", b"x"), "not"),  # bytes at random (the same each run: the
    # workers of a session collect alike): not UTF-8 or not JSON
    (b"[1, 2, 3]", "expected a JSON object, found list"),
    (b'{"runtime": "process"}', "pid: missing"),
    (json.dumps({**GOOD_INSTANCE, "pid": "abc"}).encode(), "pid: 'abc' is not a integer"),
    (json.dumps({**GOOD_INSTANCE, "pid": -5}).encode(), "pid: -5 is not a process ID"),
    (json.dumps({**GOOD_INSTANCE, "pid": 1}).encode(), "pid: 1 is not a process ID"),
    (json.dumps({**GOOD_INSTANCE, "pid": 10 ** 29}).encode(), "is not a process ID"),
    (json.dumps({**GOOD_INSTANCE, "pid": 4242.5}).encode(), "pid: 4242.5 is not a integer"),
    (json.dumps({**GOOD_INSTANCE, "pid": True}).encode(), "pid: True is not a integer"),
    (json.dumps({**GOOD_INSTANCE, "create_time": "yesterday"}).encode(), "create_time: 'yesterday' is not"),
    (json.dumps({**GOOD_INSTANCE, "create_time": None}).encode(), "create_time: null is not allowed"),
    (b'{"runtime": "process", "pid": 4242, "create_time": Infinity}', "create_time: inf is not a finite"),
    (json.dumps({**GOOD_INSTANCE, "extra": []}).encode(), "extra: [] is not a object"),
    (json.dumps({**GOOD_INSTANCE, "identity": {"pid": 4242}}).encode(), "identity: create_time: missing"),
    (b"\xff\xfe not utf-8", "not UTF-8"),
])
def test_a_bad_record_is_set_aside_logged_by_name_and_absent(tmp_path: Path, content: bytes, why: str) -> None:
    events = Events()
    state = instance_file(tmp_path, events)
    state.path.write_bytes(content)
    assert state.read() is None
    aside = tmp_path / "instance.json.bad-20231114T221320Z"
    assert not state.path.exists() and aside.read_bytes() == content and state.set_aside == [aside]
    [(level, event, kw)] = events.lines
    assert (level, event, kw["path"], kw["set_aside"]) == ("warning", "state_file_bad", str(state.path), str(aside))
    assert why in kw["reason"], kw["reason"]
    assert state.read() is None and len(events.lines) == 1  # absent now: nothing more to say


def test_a_good_record_reads_back_and_unknown_keys_are_kept(tmp_path: Path) -> None:
    state = instance_file(tmp_path)
    record = {**GOOD_INSTANCE, "from_a_newer_daemon": 1}
    assert state.write(record).ok
    assert state.read() == record and not list(tmp_path.glob("*.bad-*"))
    assert read_json(state.path) == record


def test_a_directory_record_is_set_aside_on_read_and_on_write(tmp_path: Path) -> None:
    events = Events()
    state = instance_file(tmp_path, events)
    state.path.mkdir()
    (state.path / "inside").write_text("kept")
    assert state.read() is None
    assert (tmp_path / "instance.json.bad-20231114T221320Z" / "inside").read_text() == "kept"
    state.path.mkdir()  # again, in the way of a write this time
    result = state.write(GOOD_INSTANCE)
    assert result.ok and state.read() == GOOD_INSTANCE
    assert (tmp_path / "instance.json.bad-20231114T221320Z-1").is_dir()
    assert events.names() == ["state_file_bad", "state_file_bad"]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    state = instance_file(tmp_path)
    os.mkfifo(state.path)
    assert state.read() is None
    assert (tmp_path / "instance.json.bad-20231114T221320Z").exists()


def test_an_unreadable_record_is_set_aside(tmp_path: Path) -> None:
    """Read without the capabilities that let root read any file (the tests run as root)."""
    state = tmp_path / "instance.json"
    state.write_text(json.dumps(GOOD_INSTANCE))
    os.chmod(state, 0o000)
    code = ("import sys; from pathlib import Path; from sparkd.state.files import json_state; "
            "from sparkd.state.schema import INSTANCE; "
            "log = type('L', (), {'warning': lambda self, e, **kw: print(e, kw)})(); "
            "s = json_state(Path(sys.argv[1]), INSTANCE, log=log); "
            "print('READ', s.read(), s.set_aside)")
    out = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", code,
                          str(state)], capture_output=True, text=True, timeout=60)
    assert "READ None [PosixPath(" in out.stdout, out
    assert "state_file_bad" in out.stdout and "Permission denied" in out.stdout
    assert [p.name.startswith("instance.json.bad-") for p in tmp_path.iterdir()] == [True]


@pytest.mark.parametrize("schema, good, bad, why", [
    (STATUS, {"state": "ready", "pid": 77, "updated_at": 1.5}, {"state": 3}, "state: 3 is not a string"),
    (STATUS, {"state": "stopped", "pid": None}, {"state": ""}, "state: is empty"),
    (LIFECYCLE, {"version": 1, "intent": "stop", "strikes": [{"at": 1.0, "weight": 2, "class": "oom"}]},
     {"version": 1, "intent": 3}, "intent: 3 is not a string"),
    (LIFECYCLE, {"version": 1, "intent": "run", "backoff_until": None},
     {"version": 1, "intent": "run", "strikes": [{"at": 1.0, "weight": 1}]}, "strikes: item 0: class: missing"),
    (SHM_LEDGER, {"segments": [{"name": "psm_1", "dev": 27, "inode": 5}]},
     {"segments": [{"name": "psm_1", "dev": 27}]}, "segments: item 0: inode: missing"),
])
def test_schemas(schema: Any, good: dict[str, Any], bad: dict[str, Any], why: str) -> None:
    assert schema.validate(good) == good
    with pytest.raises(BadShape, match=why):
        schema.validate(bad)


def test_a_write_of_the_wrong_shape_is_refused_not_raised(tmp_path: Path) -> None:
    events = Events()
    state = instance_file(tmp_path, events)
    result = state.write({"runtime": "process", "pid": "abc"})
    assert not result.ok and result.started and "refused to write" in (result.problem or "")
    assert not state.healthy and not state.path.exists()
    assert events.names() == ["state_write_failed"]


def test_failures_are_logged_once_per_episode_and_recovery_once(tmp_path: Path) -> None:
    events = Events()
    state = instance_file(tmp_path, events)
    blocker = tmp_path / "sub"
    blocker.write_text("a file where the folder should be")
    state.path = blocker / "instance.json"
    results = [state.write(GOOD_INSTANCE) for _ in range(5)]
    assert [r.ok for r in results] == [False] * 5 and [r.started for r in results] == [True] + [False] * 4
    assert "File exists" in (state.problem or "") and str(state.path) in (state.problem or "")
    blocker.unlink()
    assert state.write(GOOD_INSTANCE).recovered and state.healthy and state.problem is None
    assert state.write(GOOD_INSTANCE) == type(results[0])(ok=True)
    assert events.names() == ["state_write_failed", "state_write_recovered"]
    assert events.lines[1][2]["failed_writes"] == 5


def test_non_finite_floats_are_written_as_null_so_the_file_parses(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json(path, {"state": "backoff", "backoff_until": float("inf"), "nested": [float("nan"), 1.0]})
    assert json.loads(path.read_text()) == {"state": "backoff", "backoff_until": None, "nested": [None, 1.0]}
    assert to_json({"a": 1}) == '{\n  "a": 1\n}\n'


def test_dead_writers_temp_files_are_removed_live_ones_kept(tmp_path: Path) -> None:
    path = tmp_path / "instance.json"
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        mine, dead_tmp, live_tmp = (tmp_path / f".instance.json.{pid}.tmp" for pid in (os.getpid(), dead.pid, live.pid))
        other = tmp_path / ".status.json.1.tmp"
        for p in (mine, dead_tmp, live_tmp, other):
            p.write_text("{")
        assert sorted(remove_dead_temps(path)) == sorted([mine, dead_tmp])
        assert live_tmp.exists() and other.exists()
        write_json(path, {"a": 1})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live_tmp.name, other.name, "instance.json"])
    finally:
        live.kill()
        live.wait()


def test_set_aside_never_overwrites_evidence(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    names = []
    for n in range(3):
        path.write_text(str(n))
        moved = set_aside(path, 0.0)
        assert moved is not None
        names.append(moved.name)
    assert names == ["x.json.bad-19700101T000000Z", "x.json.bad-19700101T000000Z-1", "x.json.bad-19700101T000000Z-2"]
    assert [(tmp_path / n).read_text() for n in names] == ["0", "1", "2"]
    assert set_aside(tmp_path / "missing.json", 0.0) is None
