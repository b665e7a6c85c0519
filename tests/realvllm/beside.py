"""The real-vLLM tier as the whole suite runs it: in a child ``pytest`` started when the session starts and collected
by ``test_beside.py``, as the soak is (tests/soak/private.py).

The tier spends most of its minutes waiting for a real vLLM to start or to be caught failing, so beside the rest of
the suite it adds about nothing to the suite's wall time, where in line it added 8 to 12 minutes on 2 cores. Run on
its own (``pytest tests/realvllm``) it runs in line, test by test.
"""

from __future__ import annotations

import os
from pathlib import Path

from childrun import Beside, ChildRun, start_pytest

INSIDE_ENV = "SPARKD_REALVLLM_BESIDE"
INSIDE = os.environ.get(INSIDE_ENV) == "1"
# 14 scenarios on a loaded 2-core machine took 12.4 minutes at worst; the step probe's two launches (test_probe.py)
# add 4 to 6
BUDGET_S = 2400.0
COLLECTOR = "realvllm/test_beside.py::"


def is_tier_item(nodeid: str) -> bool:
    return "realvllm/" in nodeid and COLLECTOR not in nodeid


def outcome(folder: Path) -> Beside:
    return Beside(folder / "realvllm.log", BUDGET_S)


def start(folder: Path, nodeids: list[str]) -> ChildRun:
    return start_pytest(["--basetemp", str(folder / "inside"), *nodeids], outcome(folder).log, BUDGET_S,
                        {INSIDE_ENV: "1"})
