"""The operator's daemon, end to end with ``sparkd run`` and ``sparkctl``: reload (command and SIGHUP), global
options anywhere, a second SIGTERM, the hand-over, startup failures without a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from daemon_harness import BIN, Fleet, Sparkd, alive, render_toml, tree

from sparkd.host import exits


def rewrite(daemon: Sparkd, **sections: dict[str, Any]) -> None:
    for name, values in sections.items():
        daemon.config[name] = {**daemon.config.get(name, {}), **values}
    daemon.config_path.write_text(render_toml(daemon.config))


def test_reload_takes_on_a_valid_config_and_refuses_an_invalid_one(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = daemon.wait_state("ready")["pid"]
    rewrite(daemon, launch={"max_model_len": 4096}, health={"interval_s": 0.7})
    live = json.loads(daemon.ctl("status", "--json").stdout)
    assert live["config"]["reload_needed"] and "changed since sparkd loaded it" in daemon.ctl("status").stdout
    done = daemon.ctl("reload")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--max-model-len 4096" in done.stdout and "health.interval_s: 0.5 → 0.7" in done.stdout
    status = daemon.wait_for(lambda s: s["config"].get("restart_needed"), 30, "the running launch is older")
    assert status["pid"] == pid and status["state"] == "ready"
    assert "older config" in daemon.ctl("status").stdout

    rewrite(daemon, launch={"max_model_len": -1})
    refused = daemon.ctl("reload")
    assert refused.returncode == 1 and "launch.max_model_len" in refused.stderr and "Traceback" not in refused.stderr
    assert daemon.ctl("restart").returncode == 1
    assert daemon.status()["pid"] == pid, "an invalid config on disk never touches the running vLLM"

    rewrite(daemon, launch={"max_model_len": 4096})
    restarted = daemon.ctl("restart", "--wait", "--timeout", "90")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "--max-model-len" in psutil.Process(daemon.status()["pid"]).cmdline()
    cmdline = psutil.Process(daemon.status()["pid"]).cmdline()
    assert cmdline[cmdline.index("--max-model-len") + 1] == "4096"
    assert not daemon.status()["config"]["restart_needed"]


def test_sighup_reloads_and_never_ends_the_daemon(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = daemon.wait_state("ready")["pid"]
    rewrite(daemon, health={"interval_s": 0.9})
    daemon.signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while "config_reloaded" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "config_reloaded" in daemon.log()
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert daemon.status()["pid"] == pid and psutil.pid_exists(pid)


def test_global_options_are_taken_after_the_subcommand(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    daemon.wait_state("ready")
    for args in (["status", "--json", "--socket", str(daemon.socket)],
                 ["--json", "status", "--socket", str(daemon.socket)],
                 ["status", "--config", str(daemon.config_path), "--json"]):
        result = subprocess.run([str(BIN / "sparkctl"), *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, (args, result.stderr)
        assert '"state": "ready"' in result.stdout
    empty = daemon.ctl("logs", "-n", "0")
    assert empty.returncode == 0 and empty.stdout == ""


def test_a_second_sigterm_ends_vllm_without_waiting_out_the_grace(sparkd: Fleet) -> None:
    daemon = sparkd(supervisor={"stop_grace_s": 300},
                    launch={"env": {"SPARKD_STANDIN_STARTUP_SECONDS": "60",
                                    "SPARKD_STANDIN_IGNORE_SIGTERM_WHILE_LOADING": "1"}}).start()
    pid = daemon.wait_for(lambda s: s.get("phase") == "loading_weights", 60, "loading")["pid"]
    family = tree(pid)
    daemon.signal(signal.SIGTERM)
    daemon.wait_state("stopping")
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc is not None and daemon.proc.wait(120) == 0
    assert time.monotonic() - started < 120, "the second signal did not wait out the 300 s grace"
    assert alive(family) == []
    assert "forced_stop" in daemon.log()


def test_handover_leaves_vllm_for_the_next_daemon(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = daemon.wait_state("ready")["pid"]
    result = daemon.ctl("handover")
    assert result.returncode == 0 and f"pid {pid}" in result.stdout
    assert daemon.proc is not None and daemon.proc.wait(30) == 0
    assert psutil.pid_exists(pid)
    daemon.start()
    status = daemon.wait_for(lambda s: s.get("daemon_pid") == daemon.proc.pid and s.get("state") == "ready", 60,
                             "adopted")
    assert status["pid"] == pid and status["launches"] == 0


def test_a_taken_control_port_is_a_sentence_and_a_status_systemd_will_not_retry(sparkd: Fleet) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        daemon = sparkd(api={"port": holder.getsockname()[1], "listen": "127.0.0.1"}).start()
        assert daemon.proc is not None and daemon.proc.wait(30) == exits.HOST_PROBLEM
        assert "is in use by another program" in daemon.log() and "Traceback" not in daemon.log()
    finally:
        holder.close()


def test_a_socket_the_user_may_not_open_says_which_group_to_join(sparkd: Fleet, tmp_path: Path) -> None:
    daemon = sparkd().start()
    daemon.wait_state("ready")
    tmp_path.chmod(0o755)
    for parent in (daemon.tmp, daemon.socket.parent):
        parent.chmod(0o755)
    # nobody, allowed to read and search any path (the checkout may sit under a 0700 directory, as `mktemp -d`
    # makes) but not to write what it does not own: connecting to a socket is a write
    result = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                             "--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search",
                             str(BIN / "sparkctl"), "--socket", str(daemon.socket), "status"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "permission denied" in result.stderr and "group" in result.stderr and "Traceback" not in result.stderr


def test_a_run_directory_that_cannot_be_made_is_a_sentence_and_a_host_status(sparkd: Fleet) -> None:
    daemon = sparkd(paths={"run_dir": "/proc/sparkd-cannot-be-here"}).start()
    assert daemon.proc is not None and daemon.proc.wait(30) == exits.HOST_PROBLEM
    assert "startup_failed" in daemon.log() and "Traceback" not in daemon.log()


def test_restart_wait_draws_a_live_line_on_a_terminal_and_plain_lines_when_piped(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_STARTUP_SECONDS": "3"}}).start()
    daemon.wait_state("ready")
    piped = daemon.ctl("restart", "--wait", "--timeout", "90")
    assert piped.returncode == 0 and "starting: loading weights" in piped.stdout and "\x1b[" not in piped.stdout
    # On a pseudo-terminal: the live line (elapsed, ETA from the last cold start), then the result.
    command = f"{BIN / 'sparkctl'} --socket {daemon.socket} restart --wait --timeout 90"
    tty = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})
    assert tty.returncode == 0, tty.stdout
    assert "elapsed" in tty.stdout and "ETA" in tty.stdout and "ready after" in tty.stdout
