"""Observe and control a real daemon: sd_notify datagrams, /metrics checked by promtool, the token gate,
socket permissions, sparkctl commands and exit codes."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import BIN, Sparkd, base_config, peer_token
from freeport import free_port

from sparkd.cluster.peersign import Ends, sign


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Sparkd]:
    token = peer_token(tmp_path / "token")
    d = Sparkd(tmp_path, base_config(tmp_path, free_port(),
                                     api={"port": free_port(), "token_file": str(token)}))
    yield d
    d.end()


def http(url: str, token: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_notify_datagrams_from_a_running_daemon(daemon: Sparkd, tmp_path: Path) -> None:
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(30)
    daemon.start(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})
    messages = [sock.recv(4096).decode()]
    assert messages[0].startswith("READY=1\nSTATUS=")
    while not any(m.startswith("STATUS=ready") for m in messages):
        messages.append(sock.recv(4096).decode())
    watchdogs = 0
    while watchdogs < 2:
        if sock.recv(4096) == b"WATCHDOG=1":
            watchdogs += 1
    assert daemon.stop() == 0
    rest = []
    sock.settimeout(2)
    try:
        while True:
            rest.append(sock.recv(4096).decode())
    except TimeoutError:
        pass
    assert any(m.startswith("STOPPING=1") for m in rest)


def test_metrics_pass_promtool_and_show_the_state(daemon: Sparkd) -> None:
    daemon.start()
    daemon.wait_state("ready")
    code, text = http(f"http://127.0.0.1:{daemon.config['api']['port']}/metrics")
    assert code == 200
    assert 'sparkd_state{node="test",state="ready"} 1.0' in text and 'sparkd_ready{node="test"} 1.0' in text
    assert "sparkd_memory_available_bytes" in text
    assert 'sparkd_start_duration_seconds_count{node="test"} 1.0' in text
    assert 'sparkd_probes_total{node="test",probe="health",result="ok"}' in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_tcp_control_api_serves_the_configured_peers_signed_requests_only(tmp_path: Path) -> None:
    """From 127.0.0.1 (a peer here) a signed request is served once; a bearer token, a replay or an address that
    is no peer (127.0.0.2) is refused. tests/integration/test_peer_attacks.py does the same across namespaces."""
    token = peer_token(tmp_path / "token")
    secret = token.read_text().strip()
    port = free_port()
    d = Sparkd(tmp_path, base_config(tmp_path, free_port(), api={"port": port, "token_file": str(token)},
                                     cluster={"peers": [f"127.0.0.1:{port}"]}))
    try:
        d.start()
        d.wait_state("ready")
        url = f"http://127.0.0.1:{port}/v1/status"
        assert http(url)[0] == 401
        assert http(url, token=secret)[0] == 401  # the secret itself, sent as a bearer token: no longer a key
        ends = Ends("another", "127.0.0.1", f"127.0.0.1:{port}")
        good = {"Authorization": sign(secret, "GET", "/v1/status", b"", now=time.time(), ends=ends)}
        code, body = http(url, headers=good)
        assert code == 200 and json.loads(body)["result"]["state"] == "ready"
        code, body = http(url, headers=good)
        assert code == 401 and "replayed" in body
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) as stranger:
            fresh = sign(secret, "GET", "/v1/status", b"", now=time.time(), ends=Ends("another", "127.0.0.2",
                                                                                      f"127.0.0.1:{port}"))
            stranger.sendall(f"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             f"Authorization: {fresh}\r\n\r\n".encode())
            answer = b"".join(iter(lambda: stranger.recv(65536), b"")).decode()
        assert answer.startswith("HTTP/1.1 403") and "127.0.0.2 is not one" in answer
    finally:
        d.end()


def test_tcp_control_api_is_closed_without_a_token_file(tmp_path: Path) -> None:
    d = Sparkd(tmp_path, base_config(tmp_path, free_port(), api={"port": free_port()}))
    try:
        d.start()
        d.wait_state("ready")
        code, body = http(f"http://127.0.0.1:{d.config['api']['port']}/v1/status", token="anything")
        assert code == 403 and "token_file" in body
    finally:
        d.end()


def test_socket_mode_and_sparkctl_commands(daemon: Sparkd) -> None:
    daemon.start()
    daemon.wait_state("ready")
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660
    status = daemon.ctl("--json", "status")
    data = json.loads(status.stdout)
    assert status.returncode == 0
    assert {"state", "ready", "pid", "restarts", "last_failure"} <= data.keys()
    assert data["memory"]["available_bytes"] > 0
    # --wait returns once the state is reached: the very next status shows it, with no polling in between
    stopped = daemon.ctl("stop", "--wait")
    assert stopped.returncode == 0 and "stopped after" in stopped.stdout, stopped.stdout + stopped.stderr
    assert daemon.ctl("status").returncode == 3
    assert json.loads(daemon.ctl("--json", "status").stdout)["state"] == "stopped"
    started = daemon.ctl("start", "--wait")
    assert started.returncode == 0 and "ready after" in started.stdout, started.stdout + started.stderr
    after = json.loads(daemon.ctl("--json", "status").stdout)
    assert after["state"] == "ready" and after["pid"] != data["pid"]
    logs = daemon.ctl("logs", "-n", "500")
    assert "Application startup complete." in logs.stdout
    assert daemon.ctl("--json", "incidents").returncode == 0


def test_config_with_a_typo_still_finds_the_daemon_and_says_what_is_wrong(daemon: Sparkd, tmp_path: Path) -> None:
    """sparkctl --config reads only [paths] run_dir to find the daemon, and says when the rest is invalid."""
    daemon.start()
    daemon.wait_state("ready")

    def ctl(config: Path, *args: str) -> subprocess.CompletedProcess[str]:  # the socket from --config alone
        return subprocess.run([str(BIN / "sparkctl"), "--config", str(config), *args], capture_output=True,
                              text=True, timeout=60)

    good = daemon.config_path.read_text()
    other = tmp_path / "edited.toml"  # a copy being edited, with a typo
    other.write_text(good.replace("[launch]\n", "[launch]\nmax_num_seq = 3\n", 1))
    for args in (("status",), ("logs", "-n", "1")):  # the fast path and click's
        result = ctl(other, *args)
        # the daemon answered: ready (0), or between a restart's steps (3, not serving) where a loaded host starved
        # the stand-in's health probe; an invalid config refused would be 2, no daemon found 4
        assert result.returncode in (0, 3) and result.stdout, result.stderr
        notes = [line for line in result.stderr.splitlines() if "is invalid" in line]
        assert notes == [f"sparkctl: {other} is invalid (launch.max_num_seq: unknown key (did you mean "
                         f"'max_num_seqs'?)); sparkctl read only its [paths] run_dir. `sparkd check-config "
                         f"--config {other}` lists every problem"], result.stderr
    daemon.wait_state("ready")
    assert "ready since" in ctl(other, "status").stdout
    # the daemon's own file: its status says so, and sparkctl adds nothing (nor validates: the daemon's word)
    daemon.config_path.write_text(other.read_text())
    own = ctl(daemon.config_path, "status")
    assert own.returncode == 0 and "the config on disk is invalid" in own.stdout, own.stdout
    assert "launch.max_num_seq: unknown key" in own.stdout and own.stderr == "", own.stderr
    daemon.config_path.write_text(good)
    assert ctl(daemon.config_path, "status").stderr == ""
    # nobody answers where the file points: the note comes with the unreachable line
    other.write_text(other.read_text().replace(str(daemon.config["paths"]["run_dir"]), str(tmp_path / "nowhere")))
    lost = ctl(other, "status")
    assert lost.returncode == 4 and "does not answer" in lost.stderr and "max_num_seq" in lost.stderr, lost.stderr


def test_sparkctl_without_a_daemon_says_so(tmp_path: Path) -> None:
    d = Sparkd(tmp_path, base_config(tmp_path, free_port()))
    result = d.ctl("status")
    assert result.returncode == 4
    assert "does not answer" in result.stderr and "Traceback" not in result.stderr
    assert json.loads(d.ctl("--json", "status").stdout)["state"] == "unreachable"


PACKAGING = Path(__file__).resolve().parents[2] / "packaging"


def test_alert_rules_pass_promtool_unit_tests() -> None:
    folder = PACKAGING / "prometheus"
    check = subprocess.run(["promtool", "check", "rules", "sparkd-alerts.yml"], cwd=folder, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run(["promtool", "test", "rules", "sparkd-alerts.test.yml"], cwd=folder,
                           capture_output=True, text=True, timeout=60)
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_sparkctl_preflight_and_incident_detail(daemon: Sparkd) -> None:
    daemon.start()
    pid = daemon.wait_state("ready")["pid"]
    dry = daemon.ctl("preflight", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "stale_processes" in dry.stdout and "launch_target" in dry.stdout
    assert daemon.status()["pid"] == pid, "a dry run never touches the watched instance"
    refused = daemon.ctl("preflight")
    assert refused.returncode == 1 and "dry run" in refused.stderr
    os.kill(pid, 9)
    daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("pid") != pid, 60, "recovered")
    listing = daemon.ctl("incidents").stdout.split()
    detail = daemon.ctl("incidents", listing[0])
    assert detail.returncode == 0 and "SIGKILL" in detail.stdout
    assert daemon.ctl("incidents", "no-such-incident").returncode == 1
    # TAB completes the daemon's incident ids (from the --socket typed before or after the subcommand)
    incident = listing[0]
    assert complete(f"sparkctl --socket {daemon.socket} incidents ") == [f"plain,{incident}"]
    assert complete(f"sparkctl incidents --socket {daemon.socket} {incident[:9]}") == [f"plain,{incident}"]
    assert complete(f"sparkctl --socket {daemon.socket} incidents 1999") == []
    assert complete(f"sparkctl --socket {daemon.socket.parent / 'none.sock'} incidents ") == []  # silent


def complete(line: str) -> list[str]:
    """What bash completion gets for ``line`` (click's protocol; the last word is the one being completed)."""
    words = line.split(" ")
    env = {**os.environ, "_SPARKCTL_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
    done = subprocess.run([str(BIN / "sparkctl")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()
