"""``make soak``: a pair of daemons under a seeded random schedule of faults, with decoys planted and the
invariants of issue 16 checked throughout (see runner.py, invariants.py, faults.py).

Duration ``SOAK_SECONDS`` (default 180), seed ``SOAK_SEED`` (printed; set it to replay a run), details to
``SOAK_REPORT`` (default: the test's folder). Runs with ``make soak`` (``SPARKD_SOAK=1``); the daemon shell of
issue 12 is what makes it pass, and it joins the suite when that lands.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from runner import closing_line, run_soak, write_report
from schedule import seconds_from_env, seed_from_env

SECONDS = seconds_from_env()

pytestmark = [
    pytest.mark.skipif(os.environ.get("SPARKD_SOAK") != "1",
                       reason="the soak runs with `make soak` (SPARKD_SOAK=1), until the new daemon shell lands"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and a tmpfs need root (CI runs as root)"),
    pytest.mark.timeout(SECONDS + 900),
]


def test_soak(tmp_path: Path) -> None:
    seed = seed_from_env()
    print(f"\nsoak: seed {seed}, {SECONDS:.0f} s (replay with SOAK_SEED={seed})", flush=True)
    report = run_soak(tmp_path, seed, SECONDS)
    path = Path(os.environ.get("SOAK_REPORT") or tmp_path / "soak.json")
    write_report(report, path)
    listing = "\n".join(f"  - {v['what']} (x{v['count']}, first during {v['during']})" for v in report["violations"])
    print(f"{closing_line(report)}\nsoak: details in {path}\n{listing}", flush=True)
    assert not report["violations"], f"{closing_line(report)}:\n{listing}"
