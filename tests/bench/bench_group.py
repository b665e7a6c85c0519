"""Benchmark: what `sparkctl restart --wait` on a group of N nodes adds to the slowest rank's own startup
(issue 17: N = 2, 3 and 4; 4 nodes under 3 s).

    .venv/bin/python tests/bench/bench_group.py [--sizes 2,3,4] [--restarts 4] [--bare 3] [--json out.json]

N network namespaces on one bridge (tests/integration/group_harness.py) are the nodes. Each runs a stand-in
rank with a fixed 3 s startup, tensor parallel N across the nodes: the head (rank 0, API server, master port)
and N − 1 headless workers, coupled through the master port as NCCL couples them.

- own startup (the peer): the N argv's that sparkd renders, started by hand at the same moment in their
  namespaces, as a launch script would; done when the head's /health answers 200 (polled every ~10 ms from
  inside the head's namespace): the slowest rank's startup, since the head serves only once every rank joined;
- restart: ``sparkctl restart --wait`` against the head's daemon, from the moment the command starts to its
  exit (once sparkd reports the new group ready): stop every rank (the workers' stops in parallel), check that
  no ``VLLM::*`` is left on any node, preflight every node (in parallel), start the workers (in parallel),
  wait for their ranks, start the head, wait for ready.

Overhead = median restart − median own startup. The daemons run their shipped defaults (the guard's floors
for this machine aside, benchkit.GUARD_FLOORS) and the group settings the group tests use.
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
)
from group_harness import Fabric, group_configs
from pair_harness import NodeDaemon

HERE = Path(__file__).resolve()
HEALTHPOLL = HERE.parent / "healthpoll.py"
# The stand-in's startup per rank; SPARKD_BENCH_STARTUP_S lengthens it (test_bench_cleanup.py interrupts a load).
STARTUP_S = os.environ.get("SPARKD_BENCH_STARTUP_S", "3")


def configs(tmp: Path, fabric: Fabric) -> list[dict[str, Any]]:
    """group_configs' node, launch, cluster and API settings (TP = N); every other section at sparkd's defaults."""
    out = group_configs(tmp, fabric, tp=len(fabric.nodes))
    for cfg in out:
        for section in ("supervisor", "restart", "health"):
            cfg.pop(section, None)
        cfg["guard"] = dict(GUARD_FLOORS)
        cfg["cluster"] = {k: v for k, v in cfg["cluster"].items() if k in ("master_addr", "master_port", "nnodes",
                                                                           "peers")}
        cfg["launch"]["env"]["SPARKD_STANDIN_STARTUP_SECONDS"] = STARTUP_S
    return out


def bare_start(tmp: Path, fabric: Fabric, launches: list[tuple[list[str], dict[str, str]]], owned: Owned,
               ledger: ShmLedger, port: int) -> float | None:
    """Every rank by hand, at once (workers first, as a launch script would); seconds until the head answers."""
    # The poller runs in a session of its own, as the ranks do: an operator's Ctrl-C reaches the bench, whose
    # finally ends it (one reached while its interpreter started printed a traceback).
    poller = subprocess.Popen(["ip", "netns", "exec", fabric.nodes[0], sys.executable, str(HEALTHPOLL), str(port),
                               "60"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    ranks: list[subprocess.Popen[bytes]] = []
    try:  # however it ends (an interrupt included), the ranks and the poller started here end here
        time.sleep(0.3)  # the poller's interpreter is up before the ranks start
        t0 = time.monotonic()
        for i in [*range(1, len(launches)), 0]:
            argv, env = launches[i]
            with open(tmp / f"bare-{i}.log", "ab") as out:
                ranks.append(subprocess.Popen(["ip", "netns", "exec", fabric.nodes[i], *argv], stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True,
                                              env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env}))
        text, _ = poller.communicate(timeout=90)
    finally:
        for rank in ranks:
            ledger.note(owned.add_tree(rank.pid))
        for rank in reversed(ranks):  # the head first, then the workers (they would hang without their head)
            end_process(rank)
        end_process(poller)
    text = text.strip()
    return None if text in ("", "none") else float(text) - t0


def restart(head: NodeDaemon) -> tuple[float, int, str]:
    t0 = time.monotonic()
    result = subprocess.run([str(BIN / "sparkctl"), "--socket", str(head.socket), "restart", "--wait"],
                            capture_output=True, text=True, timeout=300)
    return time.monotonic() - t0, result.returncode, result.stdout


def ready_group(nodes: list[NodeDaemon], launches: int) -> None:
    def current(daemon: NodeDaemon, s: dict[str, Any]) -> bool:
        return daemon.proc is not None and s.get("daemon_pid") == daemon.proc.pid and s.get("state") == "ready"

    head = nodes[0]
    head.wait_for(lambda s: current(head, s) and s.get("launches", 0) >= launches, 150, "head ready")
    for node in nodes[1:]:
        node.wait_for(lambda s, n=node: current(n, s), 150, f"{node.ns} ready")


def one_size(tmp: Path, size: int, args: argparse.Namespace, owned: Owned, ledger: ShmLedger) -> dict[str, Any]:
    fabric = Fabric.create(size)
    nodes: list[NodeDaemon] = []
    bare: list[float] = []
    restarts: list[dict[str, Any]] = []
    try:
        cfgs = configs(tmp, fabric)
        launches = []
        for i, cfg in enumerate(cfgs):
            path = tmp / f"render-{i}.toml"
            path.write_text(render_toml(cfg))
            launches.append(rendered_launch(path))
        port = int(cfgs[0]["launch"]["port"])
        for n in range(args.bare):
            seconds = bare_start(tmp, fabric, launches, owned, ledger, port)
            log(f"  {size} ranks by hand {n + 1}/{args.bare}: head ready after {seconds} s")
            if seconds is not None:
                bare.append(round(seconds, 4))
        nodes = [NodeDaemon(tmp / f"node{i}", cfg, fabric.nodes[i]) for i, cfg in enumerate(cfgs)]
        for node in [*nodes[1:], nodes[0]]:
            node.start()
        ready_group(nodes, 1)
        for n in range(args.restarts):
            time.sleep(1.0)
            for daemon in nodes:
                ledger.note(owned.add_tree(int(daemon.status()["pid"])))
            seconds, code, out = restart(nodes[0])
            ready_group(nodes, n + 2)
            restarts.append({"seconds": round(seconds, 4), "exit": code, "steps": out.strip().splitlines(),
                             "start_timing": nodes[0].status().get("start_timing")})
            log(f"  {size} nodes: sparkctl restart --wait {n + 1}/{args.restarts}: {seconds:.2f} s (exit {code})")
    finally:
        for daemon in reversed(nodes):
            pid = daemon.status().get("pid")
            if pid:
                owned.add_tree(int(pid))
            daemon.stop(timeout=120)
        owned.kill_all()
        fabric.destroy()
    ok = [r["seconds"] for r in restarts if r["exit"] == 0]
    total, own = median(ok), median(bare)
    return {"bare": {"runs": bare, "median_s": own}, "restart": {"runs": restarts, "median_s": total},
            "overhead_s": None if total is None or own is None else total - own}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-group-"))
    owned, ledger = Owned(), ShmLedger()
    started = time.monotonic()
    sizes = [int(x) for x in args.sizes.split(",")]
    groups: dict[str, Any] = {}
    try:
        for size in sizes:
            log(f"group of {size} nodes")
            folder = tmp / f"n{size}"
            folder.mkdir()
            groups[str(size)] = one_size(folder, size, args, owned, ledger)
    finally:
        left = owned.kill_all()
        ledger.cleanup()
        if left:
            log(f"group: ended {left} leftover process(es) of ours")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"sizes": sizes, "groups": groups, "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = bench_parser(__doc__, "bench-group.json")
    parser.add_argument("--sizes", default="2,3,4")
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--bare", type=int, default=3)
    try:
        return run_bench(parser, bench)
    except KeyboardInterrupt:  # every process and namespace of the run is gone by now (the finally blocks)
        log("group: interrupted; nothing of this run is left running")
        return 130


if __name__ == "__main__":
    sys.exit(main())
