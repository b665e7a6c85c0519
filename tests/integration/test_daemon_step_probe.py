"""sparkd run installs its step probe in the launch (issue 38): the stand-in's processes, started by the daemon as
vLLM's would be, find the plugin on the PYTHONPATH the launch gives them and keep their step files in the daemon's
<run_dir>/probe; a relaunch clears the earlier launch's files; `[health] step_probe = false` launches without. The
daemon does not read the files yet (issue 38's second half)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from daemon_harness import Fleet

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
