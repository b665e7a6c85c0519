"""Benchmark: recovery and detection after the stand-in dies, under sparkd, supervisord and the field's unit.

    .venv/bin/python tests/bench/bench_recovery.py [--kills 20] [--unit-kills 8] [--litter 5] [--json out.json]

The stand-in has a fixed 3 s startup and runs as the head of a two-node world on its own (``--nnodes 2
--node-rank 0``, tensor parallel 1): its worker child binds the master port, as vLLM's rank 0 does. Same
argv and environment under every supervisor (sparkd renders them). Figures, all from the bench's own
/health poller (every ~10 ms):

- own startup: the stand-in started by hand, spawn → /health 200 (the floor every supervisor adds to);
- recovery: SIGKILL of the API server at a random moment 0.2–2 s after ready → /health 200 again;
- litter: the same with ``SPARKD_STANDIN_ORPHAN_ON_KILL=1``: the killed server's ``VLLM::EngineCore`` and
  ``VLLM::Worker`` live on, the worker holding the master port, their ``psm_*`` files in /dev/shm. The next
  start fails with EADDRINUSE unless someone ends them. Share of deaths that end healthy within a window;
- detection: kill → the supervisor's own log line about the death, over the recovery kills and
  ``--detect-extra`` more (sparkd and supervisord; the unit replay has no SIGCHLD path worth timing).

sparkd runs its shipped defaults except ``[restart] backoff_initial_s = 0`` (restart at once, like
supervisord) and the restart budget off (20 deaths in a few minutes would open its breaker, by design);
a short extra run keeps the shipped restart defaults (first failure after a healthy run: 10 s ± 10 %).
The unit's instances run side by side, their kills staggered, so that their 30 s waits overlap.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import (
    BIN,
    STANDIN_STARTUP_S,
    Owned,
    ShmLedger,
    bench_parser,
    end_process,
    free_port,
    kill_delays,
    log,
    median,
    percentile,
    render_toml,
    rendered_launch,
    run_bench,
    sparkd_config,
    standin_env,
    unique_prefix,
    wait_healthy,
)
from peers import SparkdPeer, SupervisordPeer
from trials import parallel, sequential
from unitpeer import NoShm, UnitPeer, systemd_host

BENCH_RESTART = {"backoff_initial_s": 0, "jitter": 0, "budget_failures": 1000, "consecutive_limit": 0}
# How long a death with litter may take to end healthy: sparkd 30 s; supervisord 20 s (it gives up, FATAL,
# after its 4th quick failure, ~10 s); the unit 45 s (one restart after RestartSec=30; the master port is
# still held then, and at every later restart too). The unit's clean deaths get the same 45 s.
LITTER_WINDOW_S = {"sparkd": 30.0, "supervisord": 20.0, "unit": 45.0}
UNIT_STAGGER_S = 2.5  # between the units' kills, so that their restarts 30 s later hardly overlap


class Ports:
    def __init__(self) -> None:
        self.api, self.master, self.metrics = free_port(), free_port(), free_port()


def launch_for(tmp: Path, ports: Ports, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment sparkd would launch for these ports (the peers run exactly this)."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "render.toml"
    path.write_text(render_toml(sparkd_config(tmp, ports.api, env, master_port=ports.master)))
    return rendered_launch(path)


def own_startup(tmp: Path, runs: int, owned: Owned, ledger: ShmLedger) -> list[float]:
    out = []
    for n in range(runs):
        ports = Ports()
        argv, env = launch_for(tmp / f"bare{n}", ports, standin_env(unique_prefix()))
        t0 = time.monotonic()
        popen = subprocess.Popen(argv, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        ready = wait_healthy(ports.api, 60)
        ledger.note(owned.add_tree(popen.pid))
        end_process(popen)
        if ready is not None:
            out.append(round(ready - t0, 4))
        log(f"  own startup {n + 1}/{runs}: {out[-1] if out else None} s")
    return out


def sparkd_run(tmp: Path, delays: list[float], owned: Owned, ledger: ShmLedger, *, orphan: bool = False,
               restart: dict[str, Any] | None = BENCH_RESTART, label: str = "sparkd", reset_first: bool = False,
               startup: str = STANDIN_STARTUP_S) -> list[dict[str, Any]]:
    ports = Ports()
    env = standin_env(unique_prefix(), orphan=orphan, startup=startup)
    cfg = sparkd_config(tmp, ports.api, env, master_port=ports.master, api_port=ports.metrics,
                        **({"restart": restart} if restart else {}))
    peer = SparkdPeer(tmp, cfg).start()
    window = LITTER_WINDOW_S["sparkd"] if orphan else 60.0
    reset = (lambda: peer.daemon.ctl("reset")) if reset_first else None
    try:
        return sequential(peer, ports.api, delays, owned, ledger, window=window, label=label, before_kill=reset)
    finally:
        peer.close()


def supervisord_run(tmp: Path, delays: list[float], owned: Owned, ledger: ShmLedger, *, label: str = "supervisord",
                    startup: str = STANDIN_STARTUP_S) -> list[dict[str, Any]]:
    ports = Ports()
    argv, env = launch_for(tmp, ports, standin_env(unique_prefix(), startup=startup))
    peer = SupervisordPeer(tmp, {"standin": (argv, env)}).start()
    try:
        return sequential(peer, ports.api, delays, owned, ledger, window=60.0, label=label)
    finally:
        peer.close()


def supervisord_litter(tmp: Path, n: int, owned: Owned, ledger: ShmLedger) -> list[dict[str, Any]]:
    """n programs in one supervisord, each killed once (1 s apart), each watched for the window."""
    programs, ports = {}, {}
    for i in range(n):
        ports[f"standin{i}"] = p = Ports()
        programs[f"standin{i}"] = launch_for(tmp / f"p{i}", p, standin_env(unique_prefix(), orphan=True))
    peer = SupervisordPeer(tmp, programs).start()
    try:
        for name in programs:
            if wait_healthy(ports[name].api, 120) is None:
                raise RuntimeError(f"supervisord's {name} never became ready")
        jobs = [(peer, ports[name].api, 1.0 + i, name) for i, name in enumerate(programs)]
        trials = parallel(jobs, owned, ledger, window=LITTER_WINDOW_S["supervisord"], label="supervisord litter")
        for trial, name in zip(trials, programs, strict=True):
            trial["final"] = next((line.split(" INFO ", 1)[1] for line in reversed(peer.states())
                                   if f" {name}" in line), None)
        return trials
    finally:
        peer.close()


def unit_runs(tmp: Path, clean: int, litter: int, owned: Owned, ledger: ShmLedger
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The field's unit under a real systemd (unitpeer.py), one unit per stand-in, all at once; kills staggered
    UNIT_STAGGER_S apart so that their RestartSec=30 waits overlap and no two restarts compete."""
    with systemd_host() as node:
        units, ports = [], []
        for i in range(clean + litter):
            p = Ports()
            argv, env = launch_for(tmp / f"u{i}", p, standin_env(unique_prefix(), orphan=i >= clean))
            units.append(UnitPeer(node, f"vllm-bench-u{i}", argv, env, p.api))
            ports.append(p)
        for unit in units:
            unit.start()
        try:
            for unit, p in zip(units, ports, strict=True):
                if wait_healthy(p.api, 120) is None:
                    raise RuntimeError(f"unit {unit.unit} never became ready:\n{node.journal(unit.unit)}")
            delays = kill_delays(clean + litter, seed=19)
            jobs = [(unit, p.api, UNIT_STAGGER_S * i + delays[i], None)
                    for i, (unit, p) in enumerate(zip(units, ports, strict=True))]
            trials = parallel(jobs, owned, NoShm(), window=LITTER_WINDOW_S["unit"], label="unit")
            for trial, unit in zip(trials, units, strict=True):
                trial["result"] = unit.result()
            return trials[:clean], trials[clean:]
        finally:
            for unit in units:
                unit.stop()


def summary(trials: list[dict[str, Any]], startup: float | None) -> dict[str, Any]:
    times = [t["recovery_s"] for t in trials if t["recovered"]]
    mid = median(times)
    return {"trials": len(trials), "healthy": len(times), "median_s": mid, "p90_s": percentile(times, 90),
            "over_startup_s": None if mid is None or startup is None else mid - startup,
            "stale_left": sum(t["stale_left"] for t in trials if t["recovered"]),
            "shm_left": sum(t["shm_left"] for t in trials if t["recovered"]), "runs": trials}


def detection(trials: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [t["detection_ms"] for t in trials if t.get("detection_ms") is not None]
    return {"trials": len(trials), "samples": len(samples), "p50_ms": percentile(samples, 50),
            "p99_ms": percentile(samples, 99), "max_ms": max(samples, default=None), "all_ms": samples,
            "classified_ms": [t["classified_ms"] for t in trials if t.get("classified_ms") is not None]}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    owned, ledger = Owned(), ShmLedger()
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-recovery-"))
    delays = kill_delays(args.kills)
    started = time.monotonic()
    results: dict[str, Any] = {"kills": args.kills, "delays_s": delays}
    try:
        log("recovery: the stand-in's own startup")
        startup_runs = own_startup(tmp / "bare", args.startup_runs, owned, ledger)
        startup = median(startup_runs)
        results["startup"] = {"median_s": startup, "runs": startup_runs}
        log(f"recovery: sparkd, {args.kills} kills")
        rec = {"sparkd": sparkd_run(tmp / "sparkd", delays, owned, ledger)}
        log(f"recovery: supervisord, {args.kills} kills")
        rec["supervisord"] = supervisord_run(tmp / "supervisord", delays, owned, ledger)
        if args.default_kills:
            log(f"recovery: sparkd with its shipped restart defaults, {args.default_kills} kills")
            rec["sparkd_defaults"] = sparkd_run(tmp / "sparkd-defaults", delays[:args.default_kills], owned, ledger,
                                                restart=None, label="sparkd (defaults)", reset_first=True)
        log(f"litter: sparkd, {args.litter} kills")
        lit = {"sparkd": sparkd_run(tmp / "sparkd-litter", delays[:args.litter], owned, ledger, orphan=True,
                                    label="sparkd litter")}
        log(f"litter: supervisord, {args.litter} programs")
        lit["supervisord"] = supervisord_litter(tmp / "supervisord-litter", args.litter, owned, ledger)
        log(f"recovery and litter: the field's unit, {args.unit_kills} + {args.litter} instances")
        rec["unit"], lit["unit"] = unit_runs(tmp / "unit", args.unit_kills, args.litter, owned, ledger)
        # Detection needs more deaths than recovery; these need no 3 s startup (kills 1-1.5 s after ready:
        # supervisord counts an exit within startsecs=1 as a failed start and gives up after 3).
        extra = kill_delays(args.detect_extra, seed=29, low=1.0, high=1.5)
        log(f"detection: {args.detect_extra} more kills each, 0 s stand-in startup")
        det = {"sparkd": sparkd_run(tmp / "sparkd-detect", extra, owned, ledger, label="sparkd detect", startup="0"),
               "supervisord": supervisord_run(tmp / "supervisord-detect", extra, owned, ledger,
                                              label="supervisord detect", startup="0")}
    finally:
        left = owned.kill_all()
        removed = ledger.cleanup()
        log(f"recovery: ended {left} leftover process(es) of ours, removed {removed} /dev/shm file(s) of ours")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    results["recovery"] = {k: summary(v, startup) for k, v in rec.items()}
    results["litter"] = {k: summary(v, startup) | {"window_s": LITTER_WINDOW_S[k.split('_')[0]]}
                         for k, v in lit.items()}
    results["detection"] = {k: detection(rec[k] + det[k]) for k in det}
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def main() -> int:
    parser = bench_parser(__doc__, "bench-recovery.json")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--unit-kills", type=int, default=8)
    parser.add_argument("--default-kills", type=int, default=3)
    parser.add_argument("--litter", type=int, default=5)
    parser.add_argument("--startup-runs", type=int, default=5)
    parser.add_argument("--detect-extra", type=int, default=30, help="kills for detection only, beyond --kills")
    return run_bench(parser, bench)


if __name__ == "__main__":
    sys.exit(main())
