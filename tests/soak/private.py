"""The soak as the suite runs it: in a child ``pytest`` inside a private mount namespace with a fresh /dev/shm (as
``make soak`` does), started when the session starts and collected by ``test_soak``.

The soak spends its time waiting for its faults' recoveries, so it runs beside the rest of the suite instead of
adding its minutes to it (tests/conftest.py starts it when ``test_soak`` is selected).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from schedule import seconds_from_env

SECONDS = seconds_from_env()
INSIDE = os.environ.get("SPARKD_SOAK") == "1"
REPO = Path(__file__).resolve().parents[2]
TEST = f"{Path(__file__).resolve().with_name('test_soak.py')}::test_soak"
# As `make soak` does: a private mount namespace, a fresh tmpfs on /dev/shm, then the soak itself.
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$0" "$@"']
BUDGET_S = SECONDS + 840  # the opening pass over every fault kind, past the deadline, and the cleanup


@dataclass
class PrivateSoak:
    """One soak running in its own namespace; its output in ``log``, its report in ``report``."""

    child: subprocess.Popen[bytes]
    log: Path
    report: Path
    started: float
    _out: IO[bytes]

    def wait(self) -> int | None:
        """The child's exit status, or None when it did not end within its budget (it is ended then)."""
        try:
            return self.child.wait(max(1.0, self.started + BUDGET_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.end()

    def end(self) -> None:
        """Interrupted: SIGINT first, so that the soak's own cleanup ends what it started."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
            try:
                self.child.wait(120)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait(10)
        self._out.close()

def start(folder: Path) -> PrivateSoak:
    report = Path(os.environ.get("SOAK_REPORT") or folder / "soak.json")
    log = folder / "soak.log"
    env = {**os.environ, "SPARKD_SOAK": "1", "SOAK_REPORT": str(report)}
    argv = [*PRIVATE_SHM, sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST,
            "--basetemp", str(folder / "inside")]
    out = open(log, "wb")  # noqa: SIM115 -- closed by end(), when the child is done
    child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return PrivateSoak(child, log, report, time.monotonic(), out)
