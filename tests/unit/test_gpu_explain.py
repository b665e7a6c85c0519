"""`sparkd explain` on the logs of the H100 runs (tests/data/gpu): a SIGKILL sparkd's own stop sent is never "from
outside sparkd"; a survivor whose peer's TCPStore closed before the watchdog's timeout lost its peer first."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from sparkd.cli.explain import explain, sparkd_kill
from sparkd.supervisor.failures import FailureClass

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
HUNG = (DATA / "h100x2-daemon-vllm-hung.log").read_text().splitlines()


def test_sparkds_own_sigkill_is_not_from_outside() -> None:
    """The daemon's vllm.log of the H100 run: the launch, the two ranks, sparkd's stop that had to SIGKILL."""
    failure = explain(HUNG, sig=signal.SIGKILL)
    assert "from outside sparkd (" not in failure.sentence
    assert failure.sentence.startswith("vLLM was killed by sparkd's own stop (health failed): SIGTERM, SIGKILL to "
                                       "PID 945, 946 after 5 s (hung_stop_grace_s: vLLM was wedged (hang))")
    assert failure.evidence == HUNG[-1]
    assert explain(HUNG, exit_code=137).sentence == failure.sentence  # as a shell reports it


def test_without_sparkds_stop_line_a_sigkill_is_from_outside() -> None:
    assert "from outside sparkd" in explain(HUNG[:-1], sig=signal.SIGKILL).sentence


def test_a_stop_before_the_last_launch_is_not_this_deaths() -> None:
    relaunched = [*HUNG, HUNG[0], "rank0 iter 1"]
    assert sparkd_kill(relaunched) is None and sparkd_kill(HUNG) == HUNG[-1]
    assert "from outside sparkd" in explain(relaunched, sig=signal.SIGKILL).sentence


def test_a_stop_that_needed_no_sigkill_proves_nothing() -> None:
    clean = [*HUNG[:-1], "---- sparkd: stop (operator stop): SIGTERM, ended on SIGTERM; exited with status 0"]
    assert sparkd_kill(clean) is None


def survivor_log() -> tuple[dict[str, str], list[str]]:
    head, _, body = (DATA / "h100x2-survivor-tcpstore-first.log").read_text().partition("\n---\n")
    header = dict(line[2:].split(": ", 1) for line in head.splitlines())
    return header, body.rstrip("\n").split("\n")


def test_the_survivor_log_has_the_store_closing_before_the_watchdog() -> None:
    """The real order on the H100s: TCPStore's 'Connection was likely closed' 0.01 s after rank 0's kill, the
    watchdog's timeout 30.6 s later."""
    _, lines = survivor_log()
    closed = next(i for i, line in enumerate(lines) if "Connection was likely closed" in line)
    timeout = next(i for i, line in enumerate(lines) if "Watchdog caught collective operation timeout" in line)
    assert closed < timeout


def test_sparkd_explain_on_the_survivor_says_peer_lost(tmp_path: Path) -> None:
    header, lines = survivor_log()
    log = tmp_path / "rank1.log"
    log.write_text("\n".join(lines) + "\n")
    sparkd = Path(sys.executable).with_name("sparkd")
    out = subprocess.run([str(sparkd), "explain", str(log), "--signal", header["signal"], "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["class"] == FailureClass.peer_lost.value == header["class"]
