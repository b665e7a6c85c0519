"""sparkd's log rendering (console on a terminal, JSON otherwise, syslog priorities only into the journal,
foreign loggers alike) and VllmLog's promises: never raise, lose lines only while the file is broken, cut
giant lines, keep the ring bounded in bytes."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import structlog

from sparkd.config import LogConfig
from sparkd.host.journal import JournalSink, encode_entry, stderr_is_journal, vllm_priority
from sparkd.host.logs import Ring, Rotation, VllmLog, configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    logging.getLogger().setLevel(logging.WARNING)
    for handler in [h for h in logging.getLogger().handlers if h.get_name() == "sparkd"]:
        logging.getLogger().removeHandler(handler)


def emit(**configure: object) -> list[str]:
    """Log one event of each level and one stdlib warning into a file; the lines written."""
    path = configure.pop("path")
    assert isinstance(path, Path)
    with open(path, "w") as stream:
        configure_logging(stream=stream, **configure)  # type: ignore[arg-type]
        log = get_logger(node="n1")
        log.debug("a_debug")
        log.info("an_info", value=1)
        log.warning("a_warning")
        log.error("an_error")
        logging.getLogger("uvicorn.error").warning("foreign %s", "line")
        logging.getLogger("httpx").info("foreign info")
    return path.read_text().splitlines()


def journal_env(path: Path) -> dict[str, str]:
    st = os.stat(path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_json_lines_when_not_a_terminal(tmp_path: Path) -> None:
    lines = emit(path=tmp_path / "log", environ={})
    events = [json.loads(line) for line in lines]
    assert [(e["event"], e["level"]) for e in events] == [
        ("an_info", "info"), ("a_warning", "warning"), ("an_error", "error"), ("foreign line", "warning")]
    assert events[0]["node"] == "n1" and "timestamp" in events[0]


def test_priority_prefix_only_when_stderr_is_the_journal_stream(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.touch()
    lines = emit(path=path, environ=journal_env(path))
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>", "<4>"]
    assert json.loads(lines[1][3:])["event"] == "a_warning"
    # Another file's device:inode (a pipe sparkd's stderr was redirected to) is not the journal.
    other = tmp_path / "other"
    other.touch()
    assert all(line.startswith("{") for line in emit(path=path, environ=journal_env(other)))


def test_an_events_own_level_and_timestamp_are_kept_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.touch()
    with open(path, "w") as stream:
        configure_logging(stream=stream, environ=journal_env(path))
        get_logger().warning("checked", level="fail", timestamp=12.5)
    (line,) = path.read_text().splitlines()
    event = json.loads(line[3:])
    assert line.startswith("<4>") and event["level"] == "warning"
    assert (event["level_field"], event["timestamp_field"]) == ("fail", 12.5) and event["timestamp"] != 12.5


def test_level_filters_own_and_foreign_lines(tmp_path: Path) -> None:
    lines = emit(path=tmp_path / "log", environ={}, cfg=LogConfig(level="warning"))
    assert [json.loads(line)["event"] for line in lines] == ["a_warning", "an_error", "foreign line"]
    lines = emit(path=tmp_path / "log", environ={}, cfg=LogConfig(level="debug"))
    assert json.loads(lines[0])["event"] == "a_debug"


def test_console_on_a_terminal_and_json_when_configured(tmp_path: Path) -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        configure_logging(stream=tty, environ={})
        get_logger().warning("on_a_tty", key="v")
        tty.flush()
        shown = os.read(leader, 4096).decode()
        assert "on_a_tty" in shown and not shown.lstrip().startswith("{")
        configure_logging(cfg=LogConfig(format="json"), stream=tty, environ={})
        get_logger().warning("forced_json")
        tty.flush()
        shown = os.read(leader, 4096).decode()
        assert json.loads(shown.strip())["event"] == "forced_json"
    os.close(leader)
    lines = emit(path=tmp_path / "log", environ={}, cfg=LogConfig(format="console"))
    assert "a_warning" in lines[1] and not lines[1].startswith("{")


def test_a_console_traceback_keeps_its_priority_on_every_line(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.touch()
    with open(path, "w") as stream:
        configure_logging(cfg=LogConfig(format="console"), stream=stream, environ=journal_env(path))
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            get_logger().exception("crashed")
    lines = [line for line in path.read_text().splitlines() if line]
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines), lines


def test_stderr_is_journal_needs_a_matching_device_and_inode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.touch()
    with open(path) as stream:
        assert stderr_is_journal(stream, journal_env(path))
        assert not stderr_is_journal(stream, {})
        assert not stderr_is_journal(stream, {"JOURNAL_STREAM": "garbage"})
    assert not stderr_is_journal(io.StringIO(), journal_env(path))  # no file descriptor at all


# ---- vLLM's output


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []

    def _add(self, level: str, event: str, **kw: object) -> None:
        self.events.append((level, event, kw))

    def info(self, event: str, **kw: object) -> None:
        self._add("info", event, **kw)

    def warning(self, event: str, **kw: object) -> None:
        self._add("warning", event, **kw)

    def named(self, event: str) -> list[dict[str, object]]:
        return [kw for _, e, kw in self.events if e == event]


def test_a_path_that_is_a_directory_is_logged_once_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.mkdir()
    clock, rec = Clock(), Recorder()
    log = VllmLog(path, Rotation(1 << 20, 1), retry_s=5, clock=clock, log=rec)
    for n in range(10):
        log.append(f"line {n}")
    assert log.write_error is not None and str(path) in log.write_error
    assert len(rec.named("vllm_log_write_failed")) == 1 and log.lost_lines == 10
    assert log.last(3) == ["line 7", "line 8", "line 9"]  # the ring still has them
    path.rmdir()
    log.append("too early")  # inside the retry interval: not even tried
    assert not path.exists() and log.lost_lines == 11
    clock.now = 6
    log.append("back")
    assert path.read_text() == "back\n" and log.write_error is None
    assert rec.named("vllm_log_write_recovered") == [{"path": str(path), "lost_lines": 11}]


def test_a_full_disk_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full (ENOSPC on every write) on this system")
    path = tmp_path / "vllm.log"
    # The file opens, and every write fails with ENOSPC: /dev/full in its place (a link to it is refused).
    monkeypatch.setattr("sparkd.host.logs.open_append", lambda _path: os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC))
    rec = Recorder()
    log = VllmLog(path, Rotation(1 << 20, 2), retry_s=0, clock=Clock(), log=rec)
    for n in range(5):
        log.append(f"line {n}")
    assert log.write_error is not None and "No space left" in log.write_error
    assert len(rec.named("vllm_log_write_failed")) == 1 and log.lost_lines == 5
    log.close()


def test_a_giant_line_is_cut_everywhere_and_the_ring_is_bounded_in_bytes(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    log = VllmLog(path, Rotation(1 << 30, 1), ring=Ring(2000, 256 * 1024, 64 * 1024))
    seen: list[str] = []
    log.subscribe(seen.append)
    log.append("x" * (64 * 1024 * 1024))
    (cut,) = log.last(1)
    assert len(cut) < 65 * 1024 and cut.endswith(f"[sparkd: {64 * 1024 * 1024 - 64 * 1024} more characters cut]")
    assert seen == [cut] and path.stat().st_size == len(cut) + 1
    for n in range(100):
        log.append(f"{n:04d}" + "y" * 10_000)
    kept = log.last(2000)
    assert sum(len(line) + 1 for line in kept) <= 256 * 1024 and kept[-1].startswith("0099")
    assert len(kept) < 30


def test_a_listener_that_raises_is_dropped(tmp_path: Path) -> None:
    rec = Recorder()
    log = VllmLog(tmp_path / "vllm.log", Rotation(1 << 20, 1), log=rec)
    good: list[str] = []

    def bad(line: str) -> None:
        raise RuntimeError("client went away")

    log.subscribe(bad)
    log.subscribe(good.append)
    log.append("a")
    log.append("b")
    assert good == ["a", "b"] and len(rec.named("vllm_log_listener_dropped")) == 1


def test_last_zero_is_nothing(tmp_path: Path) -> None:
    log = VllmLog(tmp_path / "vllm.log", Rotation(1 << 20, 1))
    log.append("a")
    assert log.last(0) == [] and log.last(-5) == [] and log.last(5) == ["a"]


def test_rotation_still_keeps_the_size_bound(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    log = VllmLog(path, Rotation(4096, 2))
    for n in range(400):
        log.append(f"line {n:04d} " + "z" * 40)
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm.log", "vllm.log.1", "vllm.log.2"]
    assert all(p.stat().st_size < 4096 + 100 for p in tmp_path.iterdir())


# ---- the journal's native protocol


def decode_entry(data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    while data:
        newline = data.index(b"\n")
        head = data[:newline]
        if b"=" in head:
            name, value = head.split(b"=", 1)
            fields[name.decode()] = value.decode()
            data = data[newline + 1:]
        else:
            (size,) = struct.unpack("<Q", data[newline + 1:newline + 9])
            fields[head.decode()] = data[newline + 9:newline + 9 + size].decode()
            data = data[newline + 10 + size:]
    return fields


@pytest.mark.parametrize(
    ("line", "priority"),
    [
        ("INFO 01-02 10:00:00 [api_server.py:1] Started", 6),
        ("WARNING 01-02 10:00:00 [x.py:2] slow", 4),
        ("(EngineCore_DP0 pid=12) ERROR 01-02 10:00:00 [core.py:3] dead", 3),
        ("\x1b[0;36m(VllmWorker TP0 pid=9)\x1b[0;0m CRITICAL 01-02 10:00:00 [w.py:4] gone", 2),
        ("Traceback (most recent call last):", 6),
        ("Loading safetensors checkpoint shards:  50% 1/2", 6),
    ],
)
def test_vllm_priority_from_its_level_word(line: str, priority: int) -> None:
    assert vllm_priority(line) == priority


def test_journal_sink_speaks_the_native_protocol(tmp_path: Path) -> None:
    address = tmp_path / "journal.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(address))
    server.settimeout(5)
    sink = JournalSink("vllm", extra={"SPARKD_NODE": "n1"}, path=address)
    assert sink.send("WARNING 01-02 10:00:00 [x.py:1] KV cache is full")
    assert decode_entry(server.recv(65536)) == {
        "MESSAGE": "WARNING 01-02 10:00:00 [x.py:1] KV cache is full", "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": "vllm", "SPARKD_NODE": "n1"}
    assert sink.send("two\nlines")
    assert decode_entry(server.recv(65536))["MESSAGE"] == "two\nlines"
    assert sink.send("x" * 200_000)
    assert len(decode_entry(server.recv(300_000))["MESSAGE"]) == 48 * 1024
    server.close()
    address.unlink()
    assert not sink.send("nobody listens") and sink.dropped == 1 and sink.last_error
    sink.close()
    with pytest.raises(ValueError):
        encode_entry({"bad name": "x"})


def _receiver(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.setblocking(False)
    return server


def _drain(server: socket.socket) -> list[str]:
    got: list[str] = []
    while True:
        try:
            got.append(decode_entry(server.recv(65536))["MESSAGE"])
        except BlockingIOError:
            return got


def test_a_burst_the_journal_cannot_take_at_once_waits_and_arrives_whole_in_order(tmp_path: Path) -> None:
    server = _receiver(tmp_path / "journal.sock")  # read by nobody yet: its queue fills (net.unix.max_dgram_qlen)
    sink = JournalSink("vllm", path=tmp_path / "journal.sock")
    lines = [f"INFO 01-02 10:00:00 [x.py:1] line {n}" for n in range(3000)]
    assert all(sink.send(line) for line in lines)
    assert sink.pending > 0 and sink.dropped == 0 and sink.last_error is None
    got: list[str] = []
    for _ in range(10_000):
        got += _drain(server)
        if sink.flush() and not sink.pending:
            break
    got += _drain(server)
    assert got == lines and sink.sent == 3000 and sink.dropped == 0


def test_the_journal_backlog_is_bounded_and_an_absent_journal_drops_what_waits(tmp_path: Path) -> None:
    server = _receiver(tmp_path / "journal.sock")
    sink = JournalSink("vllm", path=tmp_path / "journal.sock", backlog_bytes=4096)
    for n in range(3000):
        sink.send(f"line {n}")
    assert 0 < sink.pending < 100 and sink.dropped > 0  # the oldest waiting went first
    kept = sink.pending
    server.close()
    (tmp_path / "journal.sock").unlink()
    before = sink.dropped
    assert not sink.send("nobody listens")
    assert sink.pending == 0 and sink.dropped == before + kept + 1 and sink.last_error


@pytest.mark.anyio
async def test_vllm_log_feeds_the_journal_what_waits_and_reports_drops_once(tmp_path: Path) -> None:
    server = _receiver(tmp_path / "journal.sock")
    events: list[tuple[str, dict[str, object]]] = []

    class Log:
        def warning(self, event: str, **fields: object) -> None:
            events.append((event, fields))

        info = warning

    log = VllmLog(tmp_path / "vllm.log", Rotation(1 << 20, 1), log=Log(),  # type: ignore[arg-type]
                  journal=JournalSink("vllm", path=tmp_path / "journal.sock"))
    lines = [f"line {n}" for n in range(2000)]
    got: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(log.feed_journal, 0.001)
        await anyio.sleep(0.01)
        for line in lines:
            log.append(line)
        assert log.journal is not None and log.journal.pending > 0
        with anyio.fail_after(30):
            while len(got) < len(lines):  # nothing more is appended: feed_journal alone sends what waits
                got += _drain(server)
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert got == lines and events == []  # held back is not lost: nothing to report
    server.close()
    (tmp_path / "journal.sock").unlink()
    log.append("gone")
    log.append("still gone")
    assert [e for e, _ in events] == ["vllm_journal_failed"]


@pytest.mark.anyio
async def test_at_the_daemons_exit_what_waits_for_the_journal_is_offered_then_counted(tmp_path: Path) -> None:
    """vLLM's last lines before a stop are the stop's story: at the exit, what the journal could not take yet is
    offered for a while longer (here the journal reads again within it), and what it still will not take is dropped,
    counted and logged once."""
    server = _receiver(tmp_path / "journal.sock")  # read by nobody yet: its queue fills
    events: list[tuple[str, dict[str, object]]] = []

    class Log:
        def warning(self, event: str, **fields: object) -> None:
            events.append((event, fields))

        info = warning

    sink = JournalSink("vllm", path=tmp_path / "journal.sock")
    log = VllmLog(tmp_path / "vllm.log", Rotation(1 << 20, 1), log=Log(), journal=sink)  # type: ignore[arg-type]
    lines = [f"line {n}" for n in range(2000)]
    for line in lines:
        log.append(line)
    assert sink.pending > 0
    got: list[str] = []
    async with anyio.create_task_group() as tg:
        async def journald() -> None:  # reads again once the exit began
            while True:
                got.extend(_drain(server))
                await anyio.sleep(0.001)

        tg.start_soon(journald)
        await log.close_journal(within_s=30, every_s=0.001)
        tg.cancel_scope.cancel()
    got += _drain(server)
    assert got == lines and sink.dropped == 0 and events == []

    stuck = JournalSink("vllm", path=tmp_path / "journal.sock")  # nobody reads now: the exit gives up
    log = VllmLog(tmp_path / "vllm2.log", Rotation(1 << 20, 1), log=Log(), journal=stuck)  # type: ignore[arg-type]
    for line in lines:
        log.append(line)
    waiting = stuck.pending
    with anyio.fail_after(10):
        await log.close_journal(within_s=0.2, every_s=0.01)
    assert waiting > 0 and stuck.pending == 0 and stuck.dropped == waiting
    assert events == [("vllm_journal_left", {"lines": waiting, "dropped": waiting})]
    server.close()
