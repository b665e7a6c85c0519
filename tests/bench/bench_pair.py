"""Benchmark: what `sparkctl restart --wait` on a two-node pair adds to the stand-ins' own startup.

    .venv/bin/python tests/bench/bench_pair.py [--restarts 4] [--bare 3] [--json bench-pair.json]

Two network namespaces joined by a veth pair (tests/integration/pair_harness.py) are the two nodes. Each
runs a stand-in rank with a fixed 3 s startup: the head (rank 0, API server, master port) and the headless
worker (rank 1), coupled through the master port as NCCL couples them.

- own startup (the peer): the same two argv's that sparkd renders, started by hand at the same moment in
  their namespaces, as a launch script would; done when the head's /health answers 200 (polled every
  ~10 ms from inside the head's namespace);
- restart: ``sparkctl restart --wait`` against the head's daemon, from the moment the command starts to
  its exit (it exits once sparkd reports the new pair ready): stop both ranks, check that no ``VLLM::*`` is
  left on either node, preflight both, start the worker, wait for its rank, start the head, wait for ready.

Overhead = median restart − median own startup. The daemons run their shipped defaults (the guard's floors
for this machine aside, benchkit.GUARD_FLOORS) and the pair settings the pair tests use.

Internal mode: ``bench_pair.py poll PORT TIMEOUT`` prints the monotonic time /health first answered 200.
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
    GUARD_FLOORS,
    Owned,
    ShmLedger,
    bench_parser,
    end_process,
    log,
    median,
    render_toml,
    rendered_launch,
    run_bench,
    wait_healthy,
)
from pair_harness import Link, NodeDaemon, pair_configs

HERE = Path(__file__).resolve()
STARTUP_S = "3"


def poll_main(port: int, timeout: float) -> None:
    ready = wait_healthy(port, timeout)
    print("none" if ready is None else f"{ready:.6f}", flush=True)


def configs(tmp: Path, link: Link) -> tuple[dict[str, Any], dict[str, Any]]:
    """pair_configs' node, launch, cluster and API settings; every other section at sparkd's defaults."""
    head, worker = pair_configs(tmp, link)
    for cfg in (head, worker):
        for section in ("supervisor", "restart", "health"):
            cfg.pop(section, None)
        cfg["guard"] = dict(GUARD_FLOORS)
        cfg["cluster"] = {k: v for k, v in cfg["cluster"].items() if k in ("master_addr", "master_port", "nnodes",
                                                                           "peers")}
        cfg["launch"]["env"]["SPARKD_STANDIN_STARTUP_SECONDS"] = STARTUP_S
    return head, worker


def bare_start(tmp: Path, link: Link, launches: dict[str, tuple[list[str], dict[str, str]]], owned: Owned,
               ledger: ShmLedger, port: int) -> float | None:
    """Both ranks by hand, at once; seconds until the head's /health answers."""
    poller = subprocess.Popen(["ip", "netns", "exec", link.head_ns, sys.executable, str(HERE), "poll", str(port),
                               "60"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # the poller's interpreter is up before the ranks start
    ranks = []
    t0 = time.monotonic()
    for role, ns in (("worker", link.worker_ns), ("head", link.head_ns)):
        argv, env = launches[role]
        with open(tmp / f"bare-{role}.log", "ab") as out:
            ranks.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
                                          start_new_session=True))
    out, _ = poller.communicate(timeout=90)
    for rank in ranks:
        ledger.note(owned.add_tree(rank.pid))
    for rank in reversed(ranks):  # the head first, then the worker (it would hang without its head)
        end_process(rank)
    text = out.strip()
    return None if text in ("", "none") else float(text) - t0


def restart(head: NodeDaemon) -> tuple[float, int, str]:
    t0 = time.monotonic()
    result = subprocess.run([str(BIN / "sparkctl"), "--socket", str(head.socket), "restart", "--wait"],
                            capture_output=True, text=True, timeout=300)
    return time.monotonic() - t0, result.returncode, result.stdout


def ready_pair(head: NodeDaemon, worker: NodeDaemon, launches: int) -> None:
    def current(daemon: NodeDaemon, s: dict[str, Any]) -> bool:
        return daemon.proc is not None and s.get("daemon_pid") == daemon.proc.pid and s.get("state") == "ready"

    head.wait_for(lambda s: current(head, s) and s.get("launches", 0) >= launches, 120, "head ready")
    worker.wait_for(lambda s: current(worker, s), 120, "worker ready")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-pair-"))
    owned, ledger = Owned(), ShmLedger()
    started = time.monotonic()
    link = Link.create()
    daemons: list[NodeDaemon] = []
    bare: list[float] = []
    restarts: list[dict[str, Any]] = []
    try:
        head_cfg, worker_cfg = configs(tmp, link)
        launches = {}
        for role, cfg in (("head", head_cfg), ("worker", worker_cfg)):
            path = tmp / f"render-{role}.toml"
            path.write_text(render_toml(cfg))
            launches[role] = rendered_launch(path)
        port = int(head_cfg["launch"]["port"])
        for n in range(args.bare):
            seconds = bare_start(tmp, link, launches, owned, ledger, port)
            log(f"  pair by hand {n + 1}/{args.bare}: head ready after {seconds} s")
            if seconds is not None:
                bare.append(round(seconds, 4))
        worker = NodeDaemon(tmp / "worker", worker_cfg, link.worker_ns)
        head = NodeDaemon(tmp / "head", head_cfg, link.head_ns)
        daemons = [worker, head]
        worker.start()
        head.start()
        ready_pair(head, worker, 1)
        for n in range(args.restarts):
            time.sleep(1.0)
            for daemon in daemons:
                ledger.note(owned.add_tree(int(daemon.status()["pid"])))
            seconds, code, out = restart(head)
            ready_pair(head, worker, n + 2)
            restarts.append({"seconds": round(seconds, 4), "exit": code, "steps": out.strip().splitlines()})
            log(f"  sparkctl restart --wait {n + 1}/{args.restarts}: {seconds:.2f} s (exit {code})")
    finally:
        for daemon in reversed(daemons):
            pid = daemon.status().get("pid")
            if pid:
                owned.add_tree(int(pid))
            daemon.stop(timeout=120)
        left = owned.kill_all()
        ledger.cleanup()
        link.destroy()
        if left:
            log(f"pair: ended {left} leftover process(es) of ours")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    ok = [r["seconds"] for r in restarts if r["exit"] == 0]
    total, own = median(ok), median(bare)
    return {"bare": {"runs": bare, "median_s": own}, "restart": {"runs": restarts, "median_s": total},
            "overhead_s": None if total is None or own is None else total - own,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "poll":
        poll_main(int(sys.argv[2]), float(sys.argv[3]))
        return 0
    parser = bench_parser(__doc__, "bench-pair.json")
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--bare", type=int, default=3)
    return run_bench(parser, bench)


if __name__ == "__main__":
    sys.exit(main())
