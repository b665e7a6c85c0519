"""All of sparkd's benchmarks in one run (``make bench``): one markdown table on stdout, everything in JSON.

    .venv/bin/python tests/bench/bench_all.py [--json tests/bench/results.json] [--quick]

Runs, each as its own process (progress on stderr): bench_recovery.py (recovery, litter, detection),
bench_docker.py (the same on the docker-exec runtime), bench_footprint.py (idle footprint, what each
dependency costs, /metrics latency), bench_group.py (group restart overhead for 2, 3 and 4 nodes), the
memory guard's bench_guard.py, bench_wedge.py (wedge detection time, false positives) and bench_cli.py
(``sparkctl status`` and TAB completion against ``supervisorctl status``), then prints one table:
every figure beside its peer from the same run, the ratio, the issue's target and whether sparkd meets it (and
by how much it misses). tests/bench/README.md explains
each figure. ``--quick`` runs a few trials of each, to check the benchmarks themselves (its figures are
not the ones to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchkit import HERE, log, write_json
from report import guard_rows, render, summary_rows, wedge_rows

QUICK = {
    "bench_recovery.py": ["--kills", "3", "--unit-kills", "2", "--default-kills", "1", "--litter", "2",
                          "--startup-runs", "2", "--detect-extra", "3"],
    "bench_footprint.py": ["--seconds", "10", "--scrape-seconds", "5", "--recorder-seconds", "10"],
    "bench_docker.py": ["--kills", "3", "--unit-kills", "1", "--startup-runs", "2"],
    "bench_group.py": ["--sizes", "2,4", "--restarts", "2", "--bare", "2"],
    "bench_guard.py": ["--runs", "1", "--rates", "2"],
    "bench_wedge.py": ["--trials", "5"],
    "bench_cli.py": ["--runs", "5"],
}


def run(script: str, extra: list[str], folder: Path, quick: bool) -> tuple[dict[str, Any] | None, str, float]:
    """Run one benchmark; (its JSON or None, its stdout, seconds)."""
    out = folder / script.replace(".py", ".json")
    args = QUICK[script] if quick else extra
    log(f"==> {script} {' '.join(args)}")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(HERE / script), *args, "--json", str(out)], stdout=subprocess.PIPE,
                          text=True, cwd=HERE.parents[1])
    seconds = time.monotonic() - t0
    log(f"<== {script}: exit {proc.returncode}, {seconds:.0f} s")
    data = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
    if data is not None:
        data.setdefault("seconds", round(seconds, 1))
    return data, proc.stdout, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", default=str(HERE / "results.json"))
    parser.add_argument("--quick", action="store_true", help="a few trials of each (checks the benchmarks)")
    parser.add_argument("--guard-runs", default="5", help="bench_guard.py --runs (issue 18: every one of 5 runs)")
    parser.add_argument("--skip", default="", help="comma-separated: recovery,docker,footprint,group,guard,wedge,cli")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    started = time.monotonic()
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
        "kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "quick": args.quick, "load_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="sparkd-bench-") as tmp:
        folder = Path(tmp)
        for name, script, extra in (("recovery", "bench_recovery.py", []), ("docker", "bench_docker.py", []),
                                    ("footprint", "bench_footprint.py", []), ("group", "bench_group.py", []),
                                    ("guard", "bench_guard.py", ["--runs", args.guard_runs]),
                                    ("wedge", "bench_wedge.py", []), ("cli", "bench_cli.py", [])):
            if name in skip:
                continue
            if not (HERE / script).exists():
                results[name] = {"missing": f"tests/bench/{script} is not there yet"}
                continue
            data, stdout, seconds = run(script, extra, folder, args.quick)
            results[name] = data if data is not None else {"failed": True, "seconds": round(seconds, 1)}
            if name == "guard":
                results[name]["table"] = stdout.strip()
    results["seconds"] = round(time.monotonic() - started, 1)
    results["load_after"] = os.getloadavg()
    rows = summary_rows(results) + guard_rows(results.get("guard")) + wedge_rows(results.get("wedge"))
    results["summary"] = rows
    table = render(rows, results)
    results["table"] = table
    print(table, flush=True)
    write_json(args.json, results)
    log(f"(JSON: {args.json}; {results['seconds']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
