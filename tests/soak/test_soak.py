"""The chaos soak: a pair of daemons under a seeded random schedule of faults, with decoys planted and the
invariants of issue 16 checked throughout (see runner.py, invariants.py, catalogue.py).

Duration ``SOAK_SECONDS`` (default 180), seed ``SOAK_SEED`` (printed; set it to replay a run), details to
``SOAK_REPORT`` (default: the test's folder). It needs a mount namespace of its own with a fresh /dev/shm, so
that the decoys it plants there meet only this soak's daemons: ``make soak`` provides one (``SPARKD_SOAK=1``);
under a plain ``pytest`` the session starts it in one the same way, beside the other tests (private.py), and this
test collects its outcome.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from private import BUDGET_S, INSIDE, SECONDS, SoakOutcome
from runner import closing_line, footprint_lines, run_soak, write_report
from schedule import seed_from_env

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, mounts and a tmpfs need root (CI runs as root)"),
    pytest.mark.timeout(BUDGET_S + 180),
]


def test_soak(tmp_path: Path, soak_in_background: SoakOutcome | None) -> None:
    if not INSIDE:
        assert soak_in_background is not None, "the session did not start the soak (tests/conftest.py)"
        collect(soak_in_background)
        return
    seed = seed_from_env()
    print(f"\nsoak: seed {seed}, {SECONDS:.0f} s (replay with SOAK_SEED={seed})", flush=True)
    report = run_soak(tmp_path, seed, SECONDS)
    path = Path(os.environ.get("SOAK_REPORT") or tmp_path / "soak.json")
    write_report(report, path, tmp_path)
    listing = "\n".join(f"  - {v['what']} (x{v['count']}, first during {v['during']})" for v in report["violations"])
    logs = f"\nsoak: the daemons' logs in {report['logs']}" if report.get("logs") else ""
    footprints = "".join(f"\n{line}" for line in footprint_lines(report))
    print(f"{closing_line(report)}{footprints}\nsoak: details in {path}{logs}\n{listing}", flush=True)
    assert not report["violations"], f"{closing_line(report)}:\n{listing}"


def collect(soak: SoakOutcome) -> None:
    """The outcome of the soak the session started: its closing lines shown (in the session's summary,
    tests/conftest.py), its report checked."""
    status = soak.wait()
    output = soak.log.read_text(errors="replace")
    closing = [line for line in output.splitlines() if line.startswith("soak: ")]
    print("\n".join(closing) + f"\nsoak: the run's output in {soak.log}", flush=True)
    assert status is not None, f"the soak did not end within {BUDGET_S:.0f} s:\n{output[-3000:]}"
    assert soak.report.is_file(), f"the soak wrote no report (exit {status}):\n{output[-3000:]}"
    report = json.loads(soak.report.read_text())
    assert status == 0 and not report["violations"], f"{closing_line(report)}:\n{output[-3000:]}"
