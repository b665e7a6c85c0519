"""sparkctl's edges (issue 28): the socket found without a valid config, the status fast path's arguments, the
control client's own HTTP/1.1 over a real unix socket, ``logs --since``, ``check-config --json``, and the
``--wait`` timeout's own exit status."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from fakedaemon import FakeDaemon

from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
from sparkd.cli.ctl import status_args
from sparkd.cli.locate import DEFAULT_SOCKET, DEMO_SOCKET, locate
from sparkd.cli.logview import parse_since
from sparkd.commands import logs, status

REPO = Path(__file__).resolve().parents[2]


def test_config_gives_its_socket_even_when_the_rest_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "sparkd.toml"
    path.write_text('[paths]\nrun_dir = "/srv/sparkd/run"\n[launch]\nmax_num_seq = 3\n')  # a typo; model missing
    assert locate(None, path, env={}) .socket == Path("/srv/sparkd/run/sparkd.sock")
    assert locate(None, path, env={"SPARKD_PATHS__RUN_DIR": "/x"}).socket == Path("/x/sparkd.sock")
    path.write_text('[paths]\nrun_dir = "/srv/run"\n[launch\n')  # mid-edit: not TOML at all
    found = locate(None, path, env={})
    assert found.socket == DEFAULT_SOCKET and "is not valid TOML" in (found.note or "")


def test_socket_order_flag_config_env_demo_default(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[paths]\nrun_dir = "/from/config"\n')
    env = {"SPARKD_SOCKET": "/from/env.sock"}
    assert locate(Path("/flag.sock"), config, env=env).socket == Path("/flag.sock")
    assert locate(None, config, env=env).socket == Path("/from/config/sparkd.sock")
    assert locate(None, None, env=env).socket == Path("/from/env.sock")
    assert locate(None, None, env={}, cwd=tmp_path).socket == DEFAULT_SOCKET  # no demo here
    demo = tmp_path / DEMO_SOCKET
    demo.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(demo))
        expected = DEFAULT_SOCKET if DEFAULT_SOCKET.exists() else demo
        assert locate(None, None, env={}, cwd=tmp_path).socket == expected


@pytest.mark.parametrize(("args", "expected"), [
    (["status"], (None, None, False)),
    (["--json", "status", "--socket", "/s"], (Path("/s"), None, True)),
    (["--config=/c.toml", "status"], (None, Path("/c.toml"), False)),
    (["status", "--help"], None), (["stop"], None), (["--socket"], None), (["--socket", "status"], None),
    (["status", "status"], None), (["--json", "--json", "status"], None), ([], None), (["--socket=", "status"], None),
])
def test_only_plain_status_takes_the_fast_path(args: list[str], expected: object) -> None:
    assert status_args(args) == expected


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    fake = FakeDaemon(tmp_path / "d.sock", b"")
    yield fake
    fake.listener.close()


def answer(body: bytes, *, chunked: bool = False, status_line: bytes = b"HTTP/1.1 200 OK") -> bytes:
    if chunked:
        middle = len(body) // 2
        parts = [body[:middle], body[middle:]]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
        return status_line + b"\r\ntransfer-encoding: chunked\r\n\r\n" + framed
    return status_line + b"\r\ncontent-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(body) + body


def test_the_client_reads_content_length_and_chunked_answers(daemon: FakeDaemon) -> None:
    envelope = json.dumps({"ok": True, "result": {"state": "ready"}}).encode()
    for framed in (answer(envelope), answer(envelope, chunked=True)):
        daemon.answer = framed
        assert ControlClient(daemon.path).call(status.COMMAND, status.Request()) == {"state": "ready"}
    assert daemon.requests[-1].startswith("GET /v1/status HTTP/1.1\r\n")
    daemon.answer = answer(b"one\ntwo\nthree\n", chunked=True)
    request = logs.Request(lines=5, follow=True, since=12.5, stamps=True)
    assert list(ControlClient(daemon.path).stream(logs.COMMAND, request)) == ["one", "two", "three"]
    assert "since=12.5" in daemon.requests[-1] and "stamps=1" in daemon.requests[-1]


def test_refusals_and_broken_answers_are_named(daemon: FakeDaemon, tmp_path: Path) -> None:
    daemon.answer = answer(json.dumps({"ok": False, "error": "breaker open", "result": {"x": 1}}).encode(),
                           status_line=b"HTTP/1.1 409 Conflict")
    with pytest.raises(ActionRefused, match="breaker open") as refused:
        ControlClient(daemon.path).call(status.COMMAND, status.Request())
    assert refused.value.result == {"x": 1}
    daemon.answer = b"garbage\r\n\r\n"
    with pytest.raises(DaemonUnreachable, match="not an HTTP answer"):
        ControlClient(daemon.path).call(status.COMMAND, status.Request())
    with pytest.raises(DaemonUnreachable, match="No such file"):
        ControlClient(tmp_path / "none.sock").call(status.COMMAND, status.Request())


def test_since_takes_durations_and_iso_times() -> None:
    assert parse_since("90s", now=1000.0) == 910.0
    assert parse_since("1h30m", now=10000.0) == 10000.0 - 5400
    assert parse_since("2026-11-27T05:00:00+00:00") == 1795755600.0
    assert parse_since("2026-11-27T05:00:00Z") == 1795755600.0
    with pytest.raises(click.BadParameter, match="a duration ago"):
        parse_since("yesterday")


def test_check_config_json_for_ci(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('runtime = "process"\n[launch]\nmodel = "/m"\nmax_num_seq = 3\n')
    for path, code, valid in ((REPO / "config/examples/demo.toml", 0, True), (bad, 2, False)):
        result = subprocess.run([sys.executable, "-m", "sparkd.cli", "check-config", "--json", "--config", str(path)],
                                capture_output=True, text=True, timeout=60)
        report = json.loads(result.stdout)
        assert (result.returncode, report["valid"]) == (code, valid), result.stderr
    assert report["problems"] == ["launch.max_num_seq: unknown key (did you mean 'max_num_seqs'?)"]


def test_times_carry_their_zone() -> None:
    shown = status.when(1795755600.0)
    assert shown[:10] == "2026-11-27" and "T" in shown and shown[-6] in "+-"


def bash_complete(program: str, line: str) -> list[str]:
    """What bash completion gets from ``program`` for ``line`` (click's protocol: the last word is completed)."""
    env = {**os.environ, f"_{program.upper()}_COMPLETE": "bash_complete", "COMP_WORDS": line,
           "COMP_CWORD": str(len(line.split(" ")) - 1)}
    done = subprocess.run([str(Path(sys.executable).parent / program)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()


def test_tab_completes_profile_names() -> None:
    assert bash_complete("sparkd", "sparkd check-config --profile ") == \
        [f"plain,{name}" for name in ("1m-context", "balanced", "latency", "throughput")]
    assert bash_complete("sparkd", "sparkd check-config --profile th") == ["plain,throughput"]
    assert bash_complete("sparkd", "sparkd check-config --profile nothing") == []


def test_incident_ids_complete_to_nothing_without_a_daemon(tmp_path: Path) -> None:
    assert bash_complete("sparkctl", f"sparkctl --socket {tmp_path / 'none.sock'} incidents ") == []
    config = tmp_path / "c.toml"
    config.write_text("[paths\n")  # mid-edit: not even TOML; a TAB still says nothing
    assert bash_complete("sparkctl", f"sparkctl --config {config} incidents ") == []


@pytest.mark.parametrize("program", ["sparkd.cli.sparkd", "sparkd.cli.sparkctl", "sparkd.commands.incidents"])
def test_help_and_completion_import_no_config_models(program: str) -> None:
    """The ~0.3 s of pydantic and the config's models are paid by the commands that load a config, not by a TAB
    or --help (the 150 ms of tests/bench/bench_cli.py)."""
    heavy = ("sparkd.config", "pydantic", "anyio", "sparkd.launch.lint", "sparkd.launch")
    code = f"import sys, {program}; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_the_cli_default_config_is_the_configs() -> None:
    from sparkd.cli.locate import DEFAULT_CONFIG_PATH
    from sparkd.config import DEFAULT_CONFIG_PATH as CONFIGS

    assert DEFAULT_CONFIG_PATH == CONFIGS


def test_config_note_names_what_is_wrong_beyond_the_socket(tmp_path: Path) -> None:
    from sparkd.cli.confignote import config_note

    good = REPO / "config/examples/demo.toml"
    assert config_note(good, None) is None
    typo = tmp_path / "typo.toml"
    typo.write_text(good.read_text().replace("[launch]\n", "[launch]\nmax_num_seq = 3\n", 1))
    note = config_note(typo, None)
    assert note is not None and note.startswith(f"{typo} is invalid (launch.max_num_seq: unknown key")
    assert "sparkctl read only its [paths] run_dir" in note and f"sparkd check-config --config {typo}" in note
    assert config_note(typo, "it is not valid TOML") is None  # locate said so already
    assert config_note(None, None) is None
    # The daemon's status judged this very file: it says so itself; another file, or a relative path, is checked here
    assert config_note(typo, None, {"path": str(typo), "valid": True}) is None
    assert config_note(typo, None, {"path": str(good.resolve()), "valid": True}) == note
    assert config_note(typo, None, {"path": "typo.toml", "valid": False}) == note
    assert config_note(typo, None, {"path": None}) == note


def test_when_the_daemon_speaks_for_the_file_nothing_is_imported(tmp_path: Path) -> None:
    """The status fast path with --config naming the daemon's own file stays fast: no config models loaded."""
    typo = tmp_path / "typo.toml"
    typo.write_text("[launch]\nmax_num_seq = 3\n")
    code = ("import sys; from pathlib import Path; from sparkd.cli.confignote import config_note; "
            f"note = config_note(Path({str(typo)!r}), None, {{'path': {str(typo)!r}, 'valid': False}}); "
            "print(note, 'sparkd.config' in sys.modules, 'pydantic' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["None", "False", "False"], done.stdout + done.stderr
