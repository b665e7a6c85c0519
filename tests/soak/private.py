"""The soak as the suite runs it: in a child ``pytest`` inside a private mount namespace with a fresh /dev/shm (as
``make soak`` does), started when the session starts and collected by ``test_soak``.

The soak spends its time waiting for its faults' recoveries, so it runs beside the rest of the suite instead of
adding its minutes to it (tests/conftest.py starts it when ``test_soak`` is selected).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from childrun import Beside, ChildRun, start_pytest
from schedule import seconds_from_env

SECONDS = seconds_from_env()
INSIDE = os.environ.get("SPARKD_SOAK") == "1"
TEST = f"{Path(__file__).resolve().with_name('test_soak.py')}::test_soak"
# As `make soak` does: a private mount namespace, a fresh tmpfs on /dev/shm, then the soak itself.
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$0" "$@"']
BUDGET_S = SECONDS + 840  # the opening pass over every fault kind, past the deadline, and the cleanup


@dataclass(frozen=True)
class SoakOutcome(Beside):
    """The soak the session runs beside its tests, as any of its processes sees it: log, exit status, report."""

    report: Path


def outcome(folder: Path) -> SoakOutcome:
    return SoakOutcome(folder / "soak.log", BUDGET_S, Path(os.environ.get("SOAK_REPORT") or folder / "soak.json"))


def start(folder: Path) -> ChildRun:
    seen = outcome(folder)
    return start_pytest([TEST, "--basetemp", str(folder / "inside")], seen.log, BUDGET_S,
                        {"SPARKD_SOAK": "1", "SOAK_REPORT": str(seen.report)}, wrapper=tuple(PRIVATE_SHM))
