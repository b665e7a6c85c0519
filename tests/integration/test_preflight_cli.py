"""``sparkd preflight`` as an operator runs it (exit codes, --json, --dry-run changes nothing), and the daemon
with a failing preflight: no launch, a classified failure with the check's sentence, retries on the backoff
schedule, and a launch once the node is clean."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemon_harness import MODEL, STANDIN_SKIPS, Sparkd, base_config, render_toml
from freeport import free_port
from test_preflight_support import DECOY_ARGS, Children, listener

pytest_plugins = ["test_preflight_support"]  # fixtures: children

BIN = Path(sys.executable).parent
# These preflights look at the whole host: a prefix of this session's own, so that an orphan planted here is
# never another session's litter (nor theirs ours) when several run this file at once.
PREFIX = f"VLLMPFCLI{os.getpid()}"
STANDIN = str(BIN / "sparkd-standin")


def write_config(tmp_path: Path, port: int, **preflight: Any) -> Path:
    data: dict[str, Any] = {
        "runtime": "process",
        "node": {"name": "pftest", "role": "single"},
        "launch": {"executable": STANDIN, "model": MODEL, "host": "127.0.0.1", "port": port,
                   "env": {"VLLM_PROCESS_NAME_PREFIX": PREFIX}},
        "paths": {"state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run")},
        "preflight": {"kill_grace_s": 2.0, **preflight, "skip": [*preflight.get("skip", []), *STANDIN_SKIPS]},
    }
    path = tmp_path / "sparkd.toml"
    path.write_text(render_toml(data))
    return path


def preflight(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "sparkd"), "preflight", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120)


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in report["results"]}


# A leaked psm_* of root's is litter to every sparkd on the host: another session's preflight (its tests start
# daemons all the time) may remove a segment planted on the shared /dev/shm before this dry run looks. Planted in a
# mount namespace of this preflight's own, on a fresh /dev/shm, it meets only this preflight; the shell exits 99
# if it is gone afterwards.
PRIVATE_SHM = ('mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && head -c 1048576 /dev/zero > "/dev/shm/$0" '
               '&& "$@"; rc=$?; test -e "/dev/shm/$0" || exit 99; exit $rc')


def test_dry_run_changes_nothing(tmp_path: Path, children: Children) -> None:
    """A stale vLLM process holding the API port and a leaked /dev/shm segment all survive a dry run."""
    holder, port = listener(children, title=f"{PREFIX}::Worker_TP0", orphan=True)
    segment = f"psm_{os.urandom(4).hex()}"
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_SHM, segment,
                             str(BIN / "sparkd"), "preflight", "--config", str(write_config(tmp_path, port)),
                             "--dry-run", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout  # (99: the segment was removed)
    report = json.loads(result.stdout)
    checks = by_id(report)
    assert report["dry_run"] is True and report["ok"] is True and report["failure"] is None
    assert checks["stale_processes"]["verdict"] == "warn"
    assert f"{holder.pid} {PREFIX}::Worker_TP0 (orphaned)" in checks["stale_processes"]["found"]
    assert checks["ports"]["verdict"] == "warn"
    assert f"{port} is held by stale vLLM PID {holder.pid}" in checks["ports"]["found"]
    assert checks["dev_shm"]["verdict"] == "warn" and segment in checks["dev_shm"]["found"]
    assert list(checks) == ["container", "launch_target", "vllm_args", "builds", "stale_processes", "ports",
                            "dev_shm", "page_cache", "memory", "host", "image", "rdma", "gpu"]
    assert holder.alive()
    assert not (tmp_path / "state").exists()  # not even the state folder


def test_a_failed_check_exits_1_naming_the_holder(tmp_path: Path, children: Children) -> None:
    decoy, port = listener(children, args=DECOY_ARGS)
    result = preflight(write_config(tmp_path, port, skip=["dev_shm"]))
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"not ready: Preflight ports failed: API port (launch.port) {port} is held by PID "
                           f"{decoy.pid} (")
    assert last.endswith("[port_in_use]")
    assert "skipped ([preflight] skip)" in result.stdout
    assert decoy.alive()


def test_ready_exits_0(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = preflight(write_config(tmp_path, port, skip=["dev_shm"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "ready to launch"


def test_invalid_config_exits_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, 8000, skip=["no_such_check"])
    result = preflight(config)
    assert result.returncode == 2 and "preflight.skip.0" in result.stderr


def test_daemon_never_launches_into_a_failed_preflight_and_retries_on_backoff(
        tmp_path: Path, children: Children) -> None:
    decoy, port = listener(children, args=DECOY_ARGS)
    config = base_config(tmp_path, port, preflight={"skip": ["dev_shm"], "kill_grace_s": 2.0},
                         restart={"backoff_initial_s": 0.5, "backoff_factor": 1.0, "backoff_max_s": 0.5},
                         api={"port": 0})
    config["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"] = PREFIX
    daemon = Sparkd(tmp_path, config).start()
    try:
        def entered_preflight(s: dict) -> list[float]:  # transitions only: a phase entry (memory_settle) is not one
            return [h["at"] for h in s.get("history", []) if h.get("state") == "preflight" and "phase" not in h]

        status = daemon.wait_for(lambda s: len(entered_preflight(s))
                                 >= 3, 30, "three preflights")
        assert status["launches"] == 0 and status["pid"] is None
        failure = status["last_failure"]
        assert failure["class"] == "port_in_use"
        assert failure["message"].startswith(f"Preflight ports failed: API port (launch.port) {port} is held by "
                                             f"PID {decoy.pid} (")
        times = entered_preflight(status)
        assert all(b - a >= 0.45 for a, b in itertools.pairwise(times)), times  # the backoff
        incident = daemon.wait_incidents()[0]
        assert incident["class"] == "port_in_use"
        assert any(r["id"] == "ports" and r["verdict"] == "fail" for r in incident["preflight"])

        decoy.popen.kill()  # the port's owner goes away: the next preflight passes and vLLM launches
        decoy.popen.wait(10)
        daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("launches") == 1, 60, "ready")
    finally:
        assert daemon.stop() == 0


def test_only_the_named_checks_run_and_quiet_says_one_line(tmp_path: Path, children: Children) -> None:
    decoy, port = listener(children, args=DECOY_ARGS)
    config = write_config(tmp_path, port)
    result = preflight(config, "--check", "ports", "--check", "stale_processes", "--dry-run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert [line.split()[1] for line in result.stdout.splitlines()[:-1]] == ["stale_processes", "ports"]
    quiet = preflight(config, "--check", "ports", "--quiet")
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert quiet.stderr.startswith(f"not ready: Preflight ports failed: API port (launch.port) {port} is held by "
                                   f"PID {decoy.pid} (") and quiet.stderr.count("\n") == 1, quiet.stderr
    (tmp_path / "free").mkdir()
    free = preflight(write_config(tmp_path / "free", free_port()), "--check", "ports", "--quiet")
    assert (free.returncode, free.stdout, free.stderr) == (0, "", "")
    unknown = preflight(config, "--check", "nope")
    assert unknown.returncode == 2 and "--check nope: no such check (the checks: container, " in unknown.stderr
    assert decoy.alive()

