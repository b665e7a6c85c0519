"""The stand-in's ranks keep the step probe's files through the plugin's own writer (issue 38), loaded as vLLM loads
the plugin, so the pair tests can read them as the real vLLM's: one file per process that steps, step counts that
move with requests, a stalled step seen inside, a frozen headless rank left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
from freeport import free_port
from standin_helpers import Standin, Standins, http, wait_until

from sparkd.host.stepfiles import read_steps
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.stephistory import StepHistory, StepLimits
from sparkd.supervisor.steps import NodeSteps, judge_steps
from sparkd.vllm_probe import PLUGIN_DIR

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
LIMITS = StepLimits(floor_s=2.0, margin=8.0, cap_s=60.0, schedule_s=2.0)
HISTORY = StepHistory({1: 0.05})


def probe_env(folder: Path, **more: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    return {"SPARKD_PROBE_DIR": str(folder), "PYTHONPATH": f"{PLUGIN_DIR}:{path}" if path else str(PLUGIN_DIR),
            **more}


def steps_of(folder: Path) -> dict[str, object]:
    return {f"{r.role}-{r.rank}": r for r in read_steps(folder).records}


def complete(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> int:
    with http(host, port, timeout=timeout) as client:
        return client.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 2}).status_code


def verdict(*readings: tuple[str, Path]) -> object:
    now = time.monotonic()
    nodes = [NodeSteps(node, (r := read_steps(folder)).read_at_ns, r.records, now) for node, folder in readings]
    return judge_steps(nodes, HISTORY, now, LIMITS)


def test_every_process_that_steps_keeps_a_file_and_its_steps_move(launch: Standins, tmp_path: Path) -> None:
    folder, port = tmp_path / "probe", free_port()
    s = launch.start("m", "-tp", "2", "--port", str(port), env=probe_env(folder))
    s.wait_ready()
    wait_until(lambda: set(steps_of(folder)) == {"engine-0", "worker-0", "worker-1"})
    for _ in range(3):
        assert complete(port) == 200
    seen = steps_of(folder)
    assert [seen[k].step for k in ("engine-0", "worker-0", "worker-1")] == [3, 3, 3]  # type: ignore[attr-defined]
    w1 = seen["worker-1"]
    assert (w1.phase, w1.world_size, w1.local_rank, w1.tokens) == ("idle", 2, 1, 1)  # type: ignore[attr-defined]
    assert w1.title.endswith("::Worker_TP1")  # type: ignore[attr-defined]
    assert verdict(("a", folder)) is None


def test_a_vllm_plugins_list_without_the_probe_keeps_it_out(launch: Standins, tmp_path: Path) -> None:
    folder, port = tmp_path / "probe", free_port()
    s = launch.start("m", "--port", str(port), env=probe_env(folder, VLLM_PLUGINS="lora_filesystem_resolver"))
    s.wait_ready()
    assert complete(port) == 200
    assert list(folder.iterdir()) == []


def test_a_stalled_step_is_inside_every_rank(launch: Standins, tmp_path: Path) -> None:
    folder, port = tmp_path / "probe", free_port()
    control = tmp_path / "control"
    s = launch.start("m", "-tp", "2", "--port", str(port),
                     env=probe_env(folder, SPARKD_STANDIN_CONTROL_FILE=str(control)))
    s.wait_ready()
    assert complete(port) == 200
    control.write_text("1 stall\n")
    time.sleep(0.5)
    with contextlib.suppress(httpx.HTTPError):  # the stalled engine never answers it
        complete(port, timeout=3)
    found = wait_until(lambda: verdict(("a", folder)), timeout=20)
    assert found.cls is FailureClass.hang and "every rank has been inside step 2" in found.what  # type: ignore[attr-defined]


def test_a_frozen_headless_rank_falls_behind_and_is_named(launch: Standins, tmp_path: Path) -> None:
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    api, master = free_port(HEAD), free_port(HEAD)
    ranks = ("m", "-tp", "2", "--nnodes", "2", "--master-addr", HEAD, "--master-port", str(master))
    head = launch.start(*ranks, "--node-rank", "0", "--host", HEAD, "--port", str(api),
                        env=probe_env(head_dir, SPARKD_STANDIN_TIME_SCALE="0.01"))
    worker = launch.start(*ranks, "--node-rank", "1", "--headless", "--host", WORKER, env=probe_env(worker_dir))
    head.wait_ready()
    wait_until(lambda: "worker-1" in steps_of(worker_dir))
    assert complete(api, HEAD) == 200
    wait_until(lambda: steps_of(worker_dir)["worker-1"].step == 1)  # type: ignore[attr-defined]
    assert set(steps_of(head_dir)) == {"engine-0", "worker-0"}
    rank1 = _titled(worker, "Worker_TP1")
    os.kill(rank1.pid, signal.SIGSTOP)
    try:
        with contextlib.suppress(httpx.HTTPError):  # the head waits for the frozen rank; its RPC times out
            complete(api, HEAD, timeout=5)
        found = wait_until(lambda: verdict(("spark-a", head_dir), ("spark-b", worker_dir)), timeout=20)
    finally:
        os.kill(rank1.pid, signal.SIGCONT)
    assert found.cls is FailureClass.hang  # type: ignore[attr-defined]
    assert found.what.startswith(f"rank 1 (worker) on spark-b, PID {rank1.pid} has not begun step 2")  # type: ignore[attr-defined]


def _titled(standin: Standin, suffix: str) -> psutil.Process:
    return wait_until(lambda: next((p for name, p in standin.titled().items() if name.endswith(suffix)), None))
