"""Log-line normalisation shared by the classifier and the progress parser."""

from __future__ import annotations

import pytest

from sparkd.supervisor.logline import LogLine, clean, parse, segments, strip_ansi

CYAN, RESET = "\x1b[0;36m", "\x1b[0;0m"


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("INFO 11-26 01:20:01 [a.py:1] hello", "INFO 11-26 01:20:01 [a.py:1] hello"),
        (f"{CYAN}(APIServer pid=2172){RESET} INFO 11-26 01:20:01 [a.py:1] hi\n", "INFO 11-26 01:20:01 [a.py:1] hi"),
        ("(EngineCore_DP0 pid=2301) x", "x"),
        ("(Worker_TP1 pid=811) \x1b[1;31mERROR\x1b[0m boom\r\n", "ERROR boom"),
        ("(RayWorkerWrapper pid=9, ip=10.0.0.2) INFO: y", "INFO: y"),
        ("(Worker_TP0 pid=1) \rbar 10%\rbar 50%\r", "bar 50%"),
        ("bar 10%\r(Worker_TP0 pid=1) bar 90%", "bar 90%"),
        ("(Worker_TP0 pid=1)", ""),
        ("", ""),
        ("(not a prefix) text", "(not a prefix) text"),
        ("(EngineCore pid=7) (RayWorkerProc pid=8, ip=10.0.0.2) (Worker_TP1 pid=8) INFO 11-26 01:20:01 [a.py:1] z",
         "INFO 11-26 01:20:01 [a.py:1] z"),
    ],
)
def test_clean(raw: str, text: str) -> None:
    """Colour, the process prefixes (Ray's engine core around its worker actor around the worker: every one) and stale
    tqdm frames are removed; the current frame is kept."""
    assert clean(raw) == text


def test_segments_keep_every_frame() -> None:
    """The classifier sees every frame, oldest first, blank ones dropped."""
    assert segments("(W pid=1) \ra\r\rb \r") == ("a", "b")


def test_strip_ansi() -> None:
    """CSI sequences vanish; text stays."""
    assert strip_ansi(f"{CYAN}x{RESET}\x1b[2K y") == "x y"


def test_parse_splits_the_vllm_header() -> None:
    """Process, pid, level, source and message come apart."""
    raw = f"{CYAN}(APIServer pid=2172){RESET} WARNING 11-26 01:20:15 [multiproc_executor.py:883] Reducing"
    line = parse(raw)
    assert line == LogLine(
        text="WARNING 11-26 01:20:15 [multiproc_executor.py:883] Reducing",
        process="APIServer",
        pid=2172,
        level="WARNING",
        source="multiproc_executor.py:883",
        message="Reducing",
    )


def test_parse_without_header() -> None:
    """uvicorn and torch lines have no vLLM header: the message is the whole text."""
    line = parse("(APIServer pid=5) INFO:     Application startup complete.")
    assert (line.process, line.level) == ("APIServer", None)
    assert line.message == "INFO:     Application startup complete."
