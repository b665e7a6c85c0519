"""sparkd run supervising the stand-in as a host process: detection, classification, recovery, adoption."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import (
    STANDIN,
    Fleet,
    Sparkd,
    alive,
    kill_tree,
    render_toml,
    shm_segments,
    title_prefix,
    tree,
    unheld,
)
from freeport import free_port

from sparkd.host import exits


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def serves(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200
    except OSError:
        return False


def ready_pid(daemon: Sparkd, launches: int = 1, timeout: float = 60) -> int:
    status = daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("launches", 0) >= launches,
                             timeout, f"ready after launch {launches}")
    return int(status["pid"])


def test_starts_serves_and_stops_clean(sparkd: Fleet) -> None:
    before = shm_segments()
    daemon = sparkd().start()
    pid = ready_pid(daemon)
    port = daemon.config["launch"]["port"]
    code, body = get(f"http://127.0.0.1:{port}/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "test-model"
    procs = tree(pid)
    prefix = title_prefix(daemon.config)
    assert any(p.cmdline()[0].startswith(prefix) for p in procs[1:]), [p.cmdline() for p in procs]
    status = daemon.ctl("status")
    assert status.returncode == 0 and "ready" in status.stdout
    assert daemon.stop() == 0
    assert alive(procs) == []
    assert unheld(shm_segments() - before) == set()
    assert daemon.status()["state"] == "stopped"


def test_a_launch_killed_while_loading_leaves_no_segment_behind(sparkd: Fleet) -> None:
    """Never ready (no note at ready), SIGTERM ignored while loading, SIGKILLed after the grace: what it held in
    /dev/shm was noted just before the stop, so the sweep after it removes what the kill leaked."""
    before = shm_segments()
    daemon = sparkd(supervisor={"stop_grace_s": 1},
                    launch={"env": {"SPARKD_STANDIN_STARTUP_SECONDS": "60",
                                    "SPARKD_STANDIN_IGNORE_SIGTERM_WHILE_LOADING": "1"}}).start()
    pid = daemon.wait_for(lambda s: s.get("phase") == "loading_weights", 60, "loading")["pid"]
    family = tree(pid)
    assert shm_segments() - before, "the launch made its segments"
    stopped = daemon.ctl("stop", "--wait")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert alive(family) == []
    assert unheld(shm_segments() - before) == set()


@pytest.mark.parametrize(("knobs", "expected"), [
    ({"SPARKD_STANDIN_DIE_AFTER": "1", "SPARKD_STANDIN_DIE_MODE": "exit", "SPARKD_STANDIN_DIE_EXIT_CODE": "1"},
     {"unknown"}),
    ({"SPARKD_STANDIN_DIE_AFTER": "1", "SPARKD_STANDIN_DIE_MODE": "engine"}, {"engine_dead"}),
    ({"SPARKD_STANDIN_HANG_AFTER": "1"}, {"hang"}),
    # A wedge of an idle engine: vLLM publishes no gauge for a step that never completes (they stay at 0), and a
    # single in-process rank has no RPC timeout, so sparkd sees a canary that gets no answer while /health says
    # 200: hang once busy_grace_s is spent. (The stall check needs a running count: a wedge mid-generation.)
    ({"SPARKD_STANDIN_STALL_AFTER": "1"}, {"hang"}),
], ids=["exit-1", "engine-death", "hang", "idle-wedge"])
def test_fault_is_detected_classified_and_recovered(sparkd: Fleet, knobs: dict[str, str],
                                                    expected: set[str]) -> None:
    daemon = sparkd(launch={"env": knobs}).start()
    first = ready_pid(daemon)
    second = ready_pid(daemon, launches=2, timeout=90)
    assert second != first
    failure = daemon.status()["last_failure"] or daemon.incidents()[0]
    assert failure["class"] in expected, failure
    assert daemon.incidents(), "every failure leaves an incident folder"


def test_an_exit_0_is_a_failure_seen_by_the_exit_not_the_health_probe(sparkd: Fleet) -> None:
    """vLLM exits 0 while /health is 30 s away (tests/MUTATION.md M08i): the exit itself is the failure, at once."""
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_DIE_AFTER": "0.5", "SPARKD_STANDIN_DIE_MODE": "exit",
                                    "SPARKD_STANDIN_DIE_EXIT_CODE": "0"}},
                    health={"interval_s": 30, "canary": False}).start()
    ready_pid(daemon)
    status = daemon.wait_for(lambda s: s.get("launches", 0) >= 2 and s.get("last_failure") is not None, 25,
                             "a relaunch after the exit, well before the next /health probe")
    assert status["last_failure"]["class"] == "engine_dead" and status["last_failure"]["exit_code"] == 0


def test_sigkill_of_vllm_is_a_crash_and_recovers(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = ready_pid(daemon)
    os.kill(pid, signal.SIGKILL)
    new = ready_pid(daemon, launches=2)
    assert new != pid
    status = daemon.status()
    assert status["restarts"] == 1
    assert status["last_failure"]["signal"] == signal.SIGKILL
    assert "SIGKILL" in status["last_failure"]["message"]
    folder = sorted((daemon.state_dir / "incidents").iterdir())[-1]
    assert {"incident.json", "log-tail.txt", "meminfo.txt"} <= {p.name for p in folder.iterdir()}


def test_missing_launch_target_fails_once_with_the_path(sparkd: Fleet, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "vllm-head.sh"
    daemon = sparkd(launch={"executable": str(missing)}).start()
    status = daemon.wait_state("failed", timeout=30)
    assert str(missing) in status["last_failure"]["message"]
    assert status["last_failure"]["class"] == "config_error"
    # the status names the failure before its incident folder is written (the classifier's tables load with it)
    assert status["launches"] == 0 and len(daemon.wait_incidents(1)) == 1
    assert daemon.ctl("status").returncode == 1


def test_repeated_crashes_back_off_open_the_breaker_and_reset_closes_it(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_DIE_AFTER": "0.2", "SPARKD_STANDIN_DIE_MODE": "exit"}},
                    restart={"budget_failures": 3, "backoff_initial_s": 0.5}).start()
    status = daemon.wait_state("failed", timeout=120)
    assert status["breaker"]["open"] and "3 failures" in status["breaker"]["reason"]
    assert status["launches"] == 3
    delays = [event["backoff_s"] for event in daemon.events("transition") if event.get("to") == "backoff"]
    assert delays == [0.5, 1.0], f"the backoff doubles: {delays}"
    spells = backoff_spells(status["history"])
    assert len(spells) == 2 and all(s >= d - 0.05 for s, d in zip(spells, delays, strict=True)), spells  # waited
    refused = daemon.ctl("start")
    assert refused.returncode == 1 and "breaker" in refused.stderr
    assert daemon.ctl("reset").returncode == 0
    after = daemon.wait_for(lambda s: s.get("launches", 0) >= 4, 60, "a launch after reset")
    assert not after["breaker"]["open"]


def backoff_spells(history: list[dict[str, Any]]) -> list[float]:
    """How long each backoff lasted, from the daemon's history of states."""
    states = [h for h in history if "phase" not in h]
    return [b["at"] - a["at"] for a, b in itertools.pairwise(states) if a["state"] == "backoff"]


def test_daemon_sigkill_then_restart_adopts_the_running_instance(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = ready_pid(daemon)
    daemon.kill()
    assert psutil.pid_exists(pid)
    daemon.start()
    status = daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("daemon_pid") == daemon.proc.pid,
                             60, "ready under the new daemon")
    assert status["pid"] == pid
    assert status["restarts"] == 0 and status["launches"] == 0
    assert "adopted" in daemon.log()


def test_sparkctl_restart_wait_reports_phases(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    pid = ready_pid(daemon)
    result = daemon.ctl("restart", "--wait", "--timeout", "90")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight" in result.stdout and "ready" in result.stdout
    assert daemon.status()["pid"] != pid


def test_leave_running_on_sigterm_keeps_vllm_for_the_next_daemon(sparkd: Fleet) -> None:
    daemon = sparkd(supervisor={"leave_running": True}).start()
    pid = ready_pid(daemon)
    assert daemon.stop() == 0
    assert psutil.pid_exists(pid)
    daemon.start()
    status = daemon.wait_for(lambda s: s.get("daemon_pid") == daemon.proc.pid and s.get("state") == "ready",
                             60, "adopted")
    assert status["pid"] == pid


def test_second_daemon_on_the_node_is_refused(sparkd: Fleet) -> None:
    daemon = sparkd().start()
    ready_pid(daemon)
    (daemon.tmp / "again").mkdir()
    second = sparkd.add(Sparkd(daemon.tmp / "again", daemon.config)).start()  # ended with the fleet if it ran
    assert second.proc is not None and second.proc.wait(30) == exits.ALREADY_RUNNING
    assert "already_running" in second.log() and "Traceback" not in second.log()


def test_rehearse_runs_a_real_config_with_the_stand_in(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"executable": "vllm-that-is-not-installed",
                            "compilation_config": {"cudagraph_mode": "PIECEWISE"}})
    daemon.config["preflight"]["skip"] = []  # a real config: the rehearsal itself skips what it must
    daemon.config_path.write_text(render_toml(daemon.config))
    daemon.start("--rehearse")
    pid = ready_pid(daemon, timeout=30)
    cmdline = psutil.Process(pid).cmdline()
    assert str(STANDIN) in cmdline and "--compilation-config" in cmdline
    assert cmdline[cmdline.index("--compilation-config") + 1] == '{"cudagraph_mode": "PIECEWISE"}'


GIB = 1 << 30


def test_memory_guard_stops_a_leaking_vllm_and_reports_killed_by_guard(sparkd: Fleet) -> None:
    from sparkd.guard.meminfo import read_meminfo

    meminfo = read_meminfo()
    assert meminfo is not None
    available = meminfo.mem_available
    if available < 8 * GIB:
        pytest.skip(f"needs 8 GiB MemAvailable to leave the machine safe, has {available / GIB:.1f}")
    stop = available - int(1.5 * GIB)  # the stand-in must leak ~1.5 GiB to cross it; it is capped at 3 GiB
    daemon = sparkd(
        launch={"env": {"SPARKD_STANDIN_LEAK_MB_PER_S": "400", "SPARKD_STANDIN_LEAK_MAX_MB": "3000"}},
        guard={"warn_below": stop + GIB // 2, "refuse_start_below": stop, "stop_below": stop,
               "kill_below": stop - GIB // 2, "stop_grace_s": 5},
        restart={"backoff_initial_s": 30})
    # A neighbour's vLLM with the same titles (the same prefix), started by hand: the guard's victims and the
    # sweep after its stop are only this instance's tree (issue 23).
    env = {**os.environ, "SPARKD_STANDIN_STARTUP_SECONDS": "0.5",
           "VLLM_PROCESS_NAME_PREFIX": daemon.config["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"]}
    port = free_port()
    neighbour = subprocess.Popen([str(STANDIN), "serve", "/models/neighbour", "--port", str(port)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not serves(port):
            assert time.monotonic() < deadline, "the neighbour never served"
            time.sleep(0.1)
        before = {(p.pid, p.create_time()) for p in tree(neighbour.pid)}
        daemon.start()
        status = daemon.wait_for(lambda s: (s.get("last_failure") or {}).get("class") == "killed_by_guard", 120,
                                 "a guard stop")
        daemon.wait_for(lambda s: s.get("state") == "backoff", 60, "the stop and its sweep done")
        assert any(p.cmdline()[0].startswith(title_prefix(daemon.config)) for p in alive(tree(neighbour.pid)))
        assert {(p.pid, p.create_time()) for p in alive(tree(neighbour.pid))} == before, "the neighbour was hit"
    finally:
        kill_tree(alive(tree(neighbour.pid)))
        neighbour.wait(10)
    assert "memory guard" in status["last_failure"]["message"]
    incidents = [i for i in daemon.incidents() if i["class"] == "killed_by_guard"]
    assert len(incidents) == 1, "evidence written once"
    assert (Path(incidents[0]["path"]) / "guard.json").is_file(), "with the guard's view"
