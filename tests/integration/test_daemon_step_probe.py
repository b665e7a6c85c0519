"""sparkd run installs its step probe in the launch and reads it (issue 38): the stand-in's processes, started by the
daemon as vLLM's would be, find the plugin on the PYTHONPATH the launch gives them and keep their step files in the
daemon's <run_dir>/probe; a relaunch clears the earlier launch's files; `[health] step_probe = false` launches without.
The daemon reads every rank's file while vLLM serves: a step that does not end is named by its ranks, PIDs and step
with vLLM's metrics off, each rank's last records go into the incident, and a vLLM that did not load the probe is
supervised as before, with one warning in status."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from daemon_harness import STANDIN, Fleet

from sparkd.host.stepfiles import read_steps


def complete(port: int) -> int:
    body = json.dumps({"model": "test-model", "prompt": "hello", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(answer.status)


def test_the_launch_installs_the_probe_and_clears_the_last_launchs_files(sparkd: Fleet) -> None:
    daemon = sparkd(launch={"tensor_parallel_size": 2})
    daemon.start()
    daemon.wait_state("ready")
    probe = Path(daemon.config["paths"]["run_dir"]) / "probe"
    port = daemon.config["launch"]["port"]
    assert complete(port) == 200 and complete(port) == 200
    first = {f"{r.role}-{r.rank}": r for r in read_steps(probe).records}
    assert set(first) == {"engine-0", "worker-0", "worker-1"}
    steps = {r.step for r in first.values()}  # the daemon's canaries step too
    assert len(steps) == 1 and min(steps) >= 2 and first["worker-1"].world_size == 2
    daemon.ctl("restart", "--wait")
    daemon.wait_state("ready", launches=2)
    again = {f"{r.role}-{r.rank}": r for r in read_steps(probe).records}
    assert set(again) == set(first)
    assert {r.pid for r in again.values()}.isdisjoint(r.pid for r in first.values())  # the new launch's files only


def test_off_with_one_key(sparkd: Fleet) -> None:
    daemon = sparkd(health={"step_probe": False})
    daemon.start()
    daemon.wait_state("ready")
    assert complete(daemon.config["launch"]["port"]) == 200
    assert not (Path(daemon.config["paths"]["run_dir"]) / "probe").exists()


def test_a_step_that_does_not_end_is_named_by_its_ranks_within_seconds_with_metrics_off(sparkd: Fleet) -> None:
    """--disable-log-stats at TP 2, every step stuck from 3 s after ready; the tracker alone would wait for vLLM's
    wait line (60 s) with a canary that times out after 30 s: the probe names the step the ranks are stuck in."""
    daemon = sparkd(launch={"tensor_parallel_size": 2, "extra_args": ["--disable-log-stats"],
                            "env": {"SPARKD_STANDIN_STALL_AFTER": "3"}},
                    health={"busy_grace_s": 600, "canary_interval_s": 1, "canary_timeout_s": 30,
                            "stall_after_s": 60}).start()
    ready = daemon.wait_state("ready")
    status = daemon.wait_for(lambda s: s.get("last_failure") is not None, 60, "the stuck step named")
    failure = status["last_failure"]
    assert failure["class"] == "hang", failure
    message = failure["message"]
    assert "every rank has been inside step" in message and "none finished it" in message, message
    assert "rank 0 (worker) PID" in message and "rank 1 (worker) PID" in message, message
    took = failure["at"] - ready["since"] - 3  # from the stall (3 s after ready) to the verdict; a loaded machine
    assert took <= 15, (took, message)
    steps = daemon.wait_incidents()[-1].get("steps") or ""
    for who in ("the engine core (engine 0) on test", "rank 0 (worker) on test", "rank 1 (worker) on test"):
        assert who in steps, steps  # every rank's last records


def without_the_probe(tmp: Path) -> str:
    """A vLLM that does not load the plugin (too old, or its plugins filtered): the stand-in, started without the
    directory the probe writes in."""
    wrapper = tmp / "old-vllm"
    wrapper.write_text(f"#!/bin/sh\nunset SPARKD_PROBE_DIR\nexec {STANDIN} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_vllm_without_the_probe_is_supervised_as_before_with_one_warning(sparkd: Fleet, tmp_path: Path) -> None:
    daemon = sparkd(launch={"executable": without_the_probe(tmp_path),
                            "env": {"SPARKD_STANDIN_STALL_AFTER": "15"}}).start()
    daemon.wait_state("ready")
    probe = Path(daemon.config["paths"]["run_dir"]) / "probe"
    assert probe.is_dir() and not list(probe.iterdir()), "the launch made the folder; nothing wrote in it"

    def warned(live: dict[str, Any]) -> bool:
        return bool((live.get("steps") or {}).get("warning"))

    deadline, live = time.monotonic() + 40, {}
    while not warned(live) and time.monotonic() < deadline:
        live = json.loads(daemon.ctl("status", "--json").stdout)
        time.sleep(0.5)
    warning = live["steps"]["warning"]
    assert warning.startswith("no step file") and "supervised without it" in warning, warning
    shown = daemon.ctl("status").stdout
    assert shown.count("step probe: no step file") == 1, shown
    assert live["state"] in ("ready", "degraded") and live.get("last_failure") is None
    failure = daemon.wait_for(lambda s: s.get("last_failure") is not None, 90, "the wedge caught")["last_failure"]
    assert failure["class"] == "hang" and "the generation canary has had no answer" in failure["message"], failure
    assert os.path.isdir(probe)
