"""Hang and stall detection against the stand-in in its real-vLLM mode (gauges that move only when an engine
step completes): an idle engine's wedge is caught by the canary, not by the busy grace; a JIT compile holds
the stall check; metrics switched off are reported, and a stall is then caught by vLLM's own wait line; an
incident's log tail explains itself with `sparkd explain`."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from daemon_harness import BIN, Fleet, Sparkd


def ready(daemon: Sparkd, launches: int = 1, timeout: float = 60) -> dict[str, Any]:
    return daemon.wait_for(lambda s: s.get("state") == "ready" and s.get("launches", 0) >= launches, timeout,
                           f"ready after launch {launches}")


def test_an_idle_engine_wedge_is_a_hang_long_before_the_busy_grace(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_STALL_AFTER": "1"}},
                    health={"busy_grace_s": 600, "canary_interval_s": 1, "canary_timeout_s": 2}).start()
    ready(daemon)
    status = daemon.wait_for(lambda s: s.get("last_failure") is not None, 90, "the wedge caught")
    assert status["last_failure"]["class"] == "hang", status["last_failure"]
    assert ready(daemon, launches=2, timeout=60)["launches"] == 2


def test_a_jit_compile_holds_the_stall_check(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_JIT_AFTER": "1", "SPARKD_STANDIN_JIT_SECONDS": "9"}},
                    health={"canary_interval_s": 1, "canary_timeout_s": 2, "stall_after_s": 3}).start()
    ready(daemon)
    deadline = time.monotonic() + 14  # the compile (9 s, three times stall_after_s) and a canary answered after it
    while time.monotonic() < deadline:
        status = daemon.status()
        assert status.get("launches") == 1 and status.get("last_failure") is None, status.get("last_failure")
        time.sleep(0.5)
    assert daemon.status()["state"] in ("ready", "degraded")


def test_metrics_switched_off_are_reported(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"extra_args": ["--disable-log-stats"]})
    check = subprocess.run([str(BIN / "sparkd"), "check-config", "--config", str(daemon.config_path)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "disable-log-stats" in check.stderr
    daemon.start()
    ready(daemon)
    deadline, note = time.monotonic() + 30, None
    while note is None and time.monotonic() < deadline:  # the live status (status.json follows state changes)
        note = json.loads(daemon.ctl("status", "--json").stdout).get("watch_note")
        time.sleep(0.3)
    assert note is not None and "metrics" in note
    assert "note:" in daemon.ctl("status").stdout


def test_with_metrics_off_the_executors_wait_line_catches_a_stall(sparkd: Fleet) -> None:
    """--disable-log-stats at TP 2: no vllm:* metrics, no throughput line; the EngineCore's wait line (every
    VLLM_RINGBUFFER_WARNING_INTERVAL, 1 s here) makes the hang long before the 600 s busy grace. Without the step
    probe (a vLLM that did not load it), which would name the stuck ranks first (test_daemon_step_probe.py)."""
    daemon = sparkd(launch={"tensor_parallel_size": 2, "extra_args": ["--disable-log-stats"],
                            "env": {"SPARKD_STANDIN_STALL_AFTER": "1", "VLLM_RINGBUFFER_WARNING_INTERVAL": "1"}},
                    health={"busy_grace_s": 600, "canary_interval_s": 1, "canary_timeout_s": 2,
                            "stall_after_s": 3, "step_probe": False}).start()
    ready(daemon)
    failure = daemon.wait_for(lambda s: s.get("last_failure") is not None, 90, "the wedge caught")["last_failure"]
    assert failure["class"] == "hang" and "executor has waited" in failure["message"], failure
    assert "No available shared memory broadcast block found in 1 seconds" in failure["message"], failure


def test_sparkd_explain_reads_an_incident_as_the_daemon_did(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"env": {"SPARKD_STANDIN_CRASH": "missing_module"}},
                    restart={"budget_failures": 50}).start()
    incident = None
    deadline = time.monotonic() + 90
    while incident is None and time.monotonic() < deadline:
        found = sorted((daemon.state_dir / "incidents").glob("*/incident.json"))
        incident = found[0] if found else None
        time.sleep(0.2)
    assert incident is not None
    record = json.loads(incident.read_text())
    explained = subprocess.run([str(BIN / "sparkd"), "explain", str(incident.parent / "log-tail.txt"), "--json",
                                "--exit-code", str(record["exit_code"] or 1)],
                               capture_output=True, text=True, timeout=60)
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["class"] == record["class"] == "image_error"
    assert daemon.wait_state("failed", timeout=60)["breaker"]["open"], "an image error is not retried"
