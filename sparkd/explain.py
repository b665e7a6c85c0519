"""``sparkd explain``: classify a pasted vLLM log the way the daemon classifies an ended launch.

The operator hands over a log (a file, or ``-`` for stdin) and, when known, how the process ended (``--exit-code``,
``--signal``); the answer is the failure class, the one sentence (what happened; what to do next) and the line
it rests on. The classifier is the daemon's own (:func:`sparkd.supervisor.classify.classify`), with no config
facts: nothing here reads the node. A log sparkd wrote (``vllm.log``, an incident's ``log-tail.txt``) is read from
its last launch line on, and sparkd's own verdict there is said again (:mod:`sparkd.supervisor.marks`).
"""

from __future__ import annotations

import io
import json
import signal as _signal
import sys
from collections import deque
from typing import BinaryIO

from sparkd.supervisor.classify import MAX_SCAN_LINES, classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.marks import attempt, verdict, vllm_lines

__all__ = ["ExplainError", "explain", "parse_signal", "read_tail", "render"]


class ExplainError(Exception):
    """Bad input, said in one line that names it."""


def read_tail(source: str, stdin: BinaryIO | None = None) -> list[str]:
    """The last lines of the log at `source` (``-``: stdin), as the classifier scans them: bytes that are not
    UTF-8 are replaced, and a tqdm bar's ``\\r`` frames stay in their line (no newline translation)."""
    try:
        if source == "-":
            raw = stdin if stdin is not None else sys.stdin.buffer
            stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            return list(deque(stream, maxlen=MAX_SCAN_LINES))
        with open(source, encoding="utf-8", errors="replace", newline="") as handle:
            return list(deque(handle, maxlen=MAX_SCAN_LINES))
    except OSError as exc:
        raise ExplainError(f"cannot read the log {source!r}: {exc.strerror or exc}") from None


def parse_signal(value: str) -> int:
    """``SIGKILL``, ``KILL``, ``kill`` or ``9`` → 9."""
    text = value.strip()
    if text.isdigit():
        number = int(text)
        if 0 < number < _signal.NSIG:
            return number
        raise ExplainError(f"--signal {value!r} is not a signal number (1-{_signal.NSIG - 1})")
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(_signal.Signals[name])
    except KeyError:
        raise ExplainError(f"--signal {value!r} is not a signal name or number (e.g. SIGKILL, TERM, 9)") from None


def explain(lines: list[str], exit_code: int | None = None, sig: int | None = None) -> Failure:
    """The last attempt's failure: from the last launch (or failed preflight) line sparkd wrote on; sparkd's own
    verdict when it logged one there (a wedge seen by the canary leaves nothing in vLLM's log to read), else the
    classifier on vLLM's lines."""
    lines = attempt(lines)
    said = verdict(lines)
    if said is not None and said.cls in FailureClass.__members__:
        return Failure(FailureClass(said.cls), said.sentence, exit_code, sig, said.evidence)
    return classify(exit_code, sig, vllm_lines(lines))


def render(failure: Failure, *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"class": failure.cls.value, "sentence": failure.sentence, "evidence": failure.evidence},
                          ensure_ascii=False)
    return "\n".join([
        f"class:    {failure.cls.value}",
        f"sentence: {failure.sentence}",
        f"evidence: {failure.evidence if failure.evidence is not None else '(no log line)'}",
    ])
