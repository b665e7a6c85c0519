"""The chaos soak: a pair of daemons under a seeded random schedule of faults, with decoys planted and the
invariants of issue 16 checked throughout (see runner.py, invariants.py, catalogue.py).

Duration ``SOAK_SECONDS`` (default 120), seed ``SOAK_SEED`` (printed; set it to replay a run), details to
``SOAK_REPORT`` (default: the test's folder). It needs a mount namespace of its own with a fresh /dev/shm, so
that the decoys it plants there meet only this soak's daemons: ``make soak`` provides one (``SPARKD_SOAK=1``);
under a plain ``pytest`` the test makes one the same way and runs itself inside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from runner import closing_line, footprint_lines, run_soak, write_report
from schedule import seconds_from_env, seed_from_env

SECONDS = seconds_from_env()
INSIDE = os.environ.get("SPARKD_SOAK") == "1"
# As `make soak` does: a private mount namespace, a fresh tmpfs on /dev/shm, then the soak itself.
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$0" "$@"']

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, mounts and a tmpfs need root (CI runs as root)"),
    pytest.mark.timeout(SECONDS + 900),
]


def test_soak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not INSIDE:
        run_in_private_namespace(tmp_path, capsys)
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


def run_in_private_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """This test again, as ``make soak`` runs it; its output in soak.log, its report in soak.json."""
    report_path = Path(os.environ.get("SOAK_REPORT") or tmp_path / "soak.json")
    log_path = tmp_path / "soak.log"
    env = {**os.environ, "SPARKD_SOAK": "1", "SOAK_REPORT": str(report_path)}
    argv = [*PRIVATE_SHM, sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
            f"{Path(__file__).resolve()}::test_soak", "--basetemp", str(tmp_path / "inside")]
    with open(log_path, "wb") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 cwd=Path(__file__).resolve().parents[2])
        try:
            status = child.wait(SECONDS + 840)
        finally:
            _end(child)
    output = log_path.read_text(errors="replace")
    closing = [line for line in output.splitlines() if line.startswith("soak: ")]
    with capsys.disabled():
        print("\n" + "\n".join(closing) + f"\nsoak: the run's output in {log_path}", flush=True)
    assert report_path.is_file(), f"the soak wrote no report (exit {status}):\n{output[-3000:]}"
    report = json.loads(report_path.read_text())
    assert status == 0 and not report["violations"], f"{closing_line(report)}:\n{output[-3000:]}"


def _end(child: subprocess.Popen[bytes]) -> None:
    """An interrupted run: SIGINT first, so that the soak's own cleanup ends what it started."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(120)
        return
    child.kill()
    child.wait(10)
