"""A child ``pytest`` run beside the session: started with the session's first test, waited for by the test that
collects its outcome (the soak, tests/soak/private.py; the real-vLLM tier, tests/realvllm/beside.py). Each spends
its minutes waiting, so beside the other tests it costs the suite's wall time about nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ChildRun:
    """A child pytest; its output in ``log``, ended (with SIGINT first) once past ``budget_s``."""

    child: subprocess.Popen[bytes]
    log: Path
    started: float
    budget_s: float
    _out: IO[bytes]

    def wait(self) -> int | None:
        """The child's exit status, or None when it did not end within its budget (it is ended then)."""
        try:
            return self.child.wait(max(1.0, self.started + self.budget_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.end()

    def end(self) -> None:
        """Interrupted: SIGINT first, so that the child's own cleanup ends what it started."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
            try:
                self.child.wait(120)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait(10)
        self._out.close()


def start_pytest(args: list[str], log: Path, budget_s: float, env: dict[str, str], *,
                 wrapper: tuple[str, ...] = ()) -> ChildRun:
    """``[*wrapper, python -m pytest -q -s -p no:cacheprovider, *args]`` in the repository, output to ``log``."""
    argv = [*wrapper, sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args]
    out = open(log, "wb")  # noqa: SIM115 -- closed by end(), when the child is done
    child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO)
    return ChildRun(child, log, time.monotonic(), budget_s, out)
