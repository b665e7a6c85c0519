"""A child ``pytest`` run beside the session: started with the session's first test, collected by the test that
reports its outcome (the soak, tests/soak/private.py; the real-vLLM tier, tests/realvllm/beside.py). Each spends
its minutes waiting, so beside the other tests it costs the suite's wall time about nothing.

The suite runs in worker processes (pytest-xdist): one of them, the owner (``gw0``; the session itself when there
are no workers), starts the child and records its exit status in a file beside its log when it ends; the collecting
test, in whichever worker it runs, reads that file (:class:`Beside`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMED_OUT = "timeout"


def shared_folder(factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every worker of this session names alike: under the session's base temp, above the workers' own."""
    base = factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def is_owner() -> bool:
    """Whether this process starts the session's children: the first worker, or the session without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"


@dataclass(frozen=True)
class Beside:
    """What any process of the session sees of a child run: its log and, once it has ended, its exit status."""

    log: Path
    budget_s: float

    @property
    def status_file(self) -> Path:
        return self.log.with_suffix(".status")

    def wait(self) -> int | None:
        """The child's exit status, or None when it did not end within its budget (its owner ended it then)."""
        deadline = time.monotonic() + self.budget_s + 120  # the owner may start it a little after this call
        while time.monotonic() < deadline:
            if self.status_file.is_file():
                text = self.status_file.read_text().strip()
                return None if text == TIMED_OUT else int(text)
            time.sleep(1)
        return None


@dataclass
class ChildRun:
    """A child pytest; its output in ``log``, ended (with SIGINT first) once past ``budget_s``; its exit status
    written beside the log (:class:`Beside`) by a thread of the owner."""

    child: subprocess.Popen[bytes]
    log: Path
    started: float
    budget_s: float
    _out: IO[bytes]
    _recorder: threading.Thread | None = field(default=None, repr=False)

    def record_when_done(self) -> None:
        def record() -> None:
            status = self._wait()
            target = Beside(self.log, self.budget_s).status_file
            tmp = target.with_suffix(".tmp")
            tmp.write_text(TIMED_OUT if status is None else str(status))
            tmp.rename(target)

        self._recorder = threading.Thread(target=record, name=f"beside {self.log.name}", daemon=True)
        self._recorder.start()

    def _wait(self) -> int | None:
        try:
            return self.child.wait(max(1.0, self.started + self.budget_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.end()

    def finish(self, *, interrupted: bool) -> None:
        """At the owner's session end: let the child finish (a collector in another worker may be waiting for it),
        unless the session was interrupted or stopped early."""
        if not interrupted and self._recorder is not None:
            self._recorder.join(max(1.0, self.started + self.budget_s + 60 - time.monotonic()))
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
    # No xdist worker variables in the child: it is a session of its own (its own owner of anything beside it).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**inherited, **env}, cwd=REPO)
    run = ChildRun(child, log, time.monotonic(), budget_s, out)
    run.record_when_done()
    return run
