"""`sparkd explain`: the daemon's classifier on a log file or stdin, run as the README shows it — and bad input is
one line on stderr with exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

SPARKD = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparkd"
CORPUS = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"
FREE_MEMORY = CORPUS / "fr002-free-memory-crash-loop.log"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(SPARKD), "explain", *args], input=stdin, capture_output=True, timeout=60,
                          check=False)


def test_a_log_file_gives_class_sentence_and_evidence() -> None:
    proc = run(str(FREE_MEMORY), "--exit-code", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("class:    free_memory_refusal\n")
    assert "sentence: vLLM refused to start: only 30 of 119.67 GiB was free" in out
    assert "evidence: " in out and "(~30/119.67 GiB)" in out
    assert "runbook:  /runbook#free_memory_refusal on sparkd's HTTP port" in out


def test_json_and_stdin_give_the_same_answer() -> None:
    from_file = json.loads(run(str(FREE_MEMORY), "--json").stdout)
    from_stdin = json.loads(run("-", "--json", stdin=FREE_MEMORY.read_bytes()).stdout)
    assert from_file == from_stdin
    assert set(from_file) == {"class", "sentence", "evidence", "runbook"}
    assert from_file["class"] == "free_memory_refusal" and from_file["runbook"] == "/runbook#free_memory_refusal"


@pytest.mark.parametrize("sig", ["SIGKILL", "kill", "9"])
def test_a_signal_by_name_or_number(sig: str) -> None:
    answer = json.loads(run("-", "--signal", sig, "--json", stdin=b"INFO 07-01 12:00:00 [core.py:1] step\n").stdout)
    assert answer["class"] == "unknown"
    assert "killed by SIGKILL from outside sparkd" in answer["sentence"]


def test_bytes_that_are_not_utf8_are_read_not_fatal() -> None:
    proc = run("-", "--json", stdin=b"\xff\xfe torch.OutOfMemoryError: CUDA out of memory.\n")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["class"] == "oom"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("/nonexistent/vllm.log",), "cannot read the log '/nonexistent/vllm.log'", id="missing file"),
        pytest.param((str(CORPUS),), "cannot read the log", id="a directory"),
        pytest.param((str(FREE_MEMORY), "--signal", "SIGNOPE"), "--signal 'SIGNOPE' is not a signal name",
                     id="bad signal name"),
        pytest.param((str(FREE_MEMORY), "--signal", "99"), "--signal '99' is not a signal number", id="bad number"),
        pytest.param((str(FREE_MEMORY), "--exit-code", "300"), "--exit-code", id="exit code out of range"),
    ],
)
def test_bad_input_is_one_clear_line(args: tuple[str, ...], says: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert says in err and "Traceback" not in err, err
