"""The real-vLLM tier as the whole suite runs it: in a child ``pytest`` started when the session starts and collected
by ``test_beside.py``, as the soak is (tests/soak/private.py).

The tier spends most of its minutes waiting for a real vLLM to start or to be caught failing, so beside the rest of
the suite it adds about nothing to the suite's wall time, where in line it added 8 to 12 minutes on 2 cores. Run on
its own (``pytest tests/realvllm``) it runs in line, test by test.
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

REPO = Path(__file__).resolve().parents[2]
INSIDE_ENV = "SPARKD_REALVLLM_BESIDE"
INSIDE = os.environ.get(INSIDE_ENV) == "1"
BUDGET_S = 1800.0  # 14 scenarios on a loaded 2-core machine took 12.4 minutes at worst
COLLECTOR = "realvllm/test_beside.py::"


def is_tier_item(nodeid: str) -> bool:
    return "realvllm/" in nodeid and COLLECTOR not in nodeid


@dataclass
class BesideTier:
    """The tier running in a child pytest; its output in ``log``."""

    child: subprocess.Popen[bytes]
    log: Path
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
        """Interrupted: SIGINT first, so that the tier's own teardown stops its daemon and vLLM."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
            try:
                self.child.wait(120)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait(10)
        self._out.close()


def start(folder: Path, nodeids: list[str]) -> BesideTier:
    log = folder / "realvllm.log"
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--basetemp", str(folder / "inside"),
            *nodeids]
    out = open(log, "wb")  # noqa: SIM115 -- closed by end(), when the child is done
    child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, INSIDE_ENV: "1"},
                             cwd=REPO)
    return BesideTier(child, log, time.monotonic(), out)
