"""``sparkd explain``: classify a pasted vLLM log the way the daemon classifies an ended launch.

The operator hands over a log (a file, or ``-`` for stdin) and, when known, how the process ended (``--exit-code``,
``--signal``); the answer is the failure class, the one sentence (what happened; what to do next) and the line
it rests on, and the section of the runbook that says what to do (``/runbook#<class>`` on sparkd's HTTP port). The
classifier is the daemon's own (:func:`sparkd.supervisor.classify.classify`); with ``--config`` it is given the
facts the daemon takes from the config (:func:`sparkd.launch.facts.config_context`: the launch target, the API port,
a group's master port), so the sentence is the daemon's; nothing here reads the node. A log sparkd wrote
(``vllm.log``, an incident's ``log-tail.txt``) is read from its last launch (or failed preflight) line on, and
sparkd's own verdict there is said again (:mod:`sparkd.supervisor.marks`); an incident folder's ``incident.json``
beside the log says whether the class agrees with the incident's.

sparkd writes a line into vLLM's log after every stop (``---- sparkd: stop (REASON): SIGTERM, SIGKILL to PID …``).
A SIGKILL that such a line after the last launch says sparkd sent is sparkd's own, never one "from outside sparkd".
"""

from __future__ import annotations

import io
import json
import signal as _signal
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from sparkd.supervisor.classify import MAX_SCAN_LINES, classify
from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.marks import LAUNCH_LINE, STOP_LINE, attempt, verdict, vllm_lines
from sparkd.supervisor.runbook import failure_ref

__all__ = ["ExplainError", "explain", "incident_class", "parse_signal", "read_tail", "render"]


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


def sparkd_kill(lines: list[str]) -> str | None:
    """sparkd's own stop line after the last launch, when that stop ended in sparkd's SIGKILL; else None."""
    for line in reversed(lines):
        text = line.rstrip("\r\n")
        if text.startswith(LAUNCH_LINE):
            return None
        if text.startswith(STOP_LINE):
            return text if "SIGKILL to PID" in text else None
    return None


def explain(lines: list[str], exit_code: int | None = None, sig: int | None = None,
            context: ClassifyContext | None = None) -> Failure:
    """The last attempt's failure: from the last launch (or failed preflight) line sparkd wrote on; sparkd's own
    verdict when it logged one there (a wedge seen by the canary leaves nothing in vLLM's log to read), else the
    classifier on vLLM's lines with ``context`` (the config's facts, when given), where a SIGKILL sparkd's own stop
    sent is no kill from outside."""
    lines = attempt(lines)
    said = verdict(lines)
    if said is not None and said.cls in FailureClass.__members__:
        return Failure(FailureClass(said.cls), said.sentence, exit_code, sig, said.evidence)
    if exit_code is None and sig is None:  # not given: the process may still run
        context = replace(context or ClassifyContext(), ended_known=False)
    failure = classify(exit_code, sig, vllm_lines(lines), context=context)
    sigkill = sig == _signal.SIGKILL or (sig is None and exit_code == 128 + _signal.SIGKILL)
    killed = sparkd_kill(lines) if sigkill else None
    if killed is None or failure.cls is not FailureClass.unknown:
        return failure  # a cause the log names wins; sparkd's stop only answered it
    stopped = killed[len(STOP_LINE):].split(";")[0]
    return Failure.of(FailureClass.unknown, f"vLLM was killed by sparkd's own stop {stopped}, not from outside sparkd; "
                      "the incident of the failure that stop answered holds the cause (`sparkctl incidents`).",
                      evidence=killed, exit_code=exit_code, signal=sig)


def incident_class(source: str) -> str | None:
    """The class in the ``incident.json`` beside the log (an incident folder's ``log-tail.txt``); None when there is
    none or it cannot be read."""
    if source == "-":
        return None
    try:
        record = json.loads((Path(source).parent / "incident.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cls = record.get("class") if isinstance(record, dict) else None
    return cls if isinstance(cls, str) else None


def render(failure: Failure, *, as_json: bool, incident: str | None = None) -> str:
    """The answer; ``runbook`` is the section of the runbook sparkd serves on its HTTP port (``/runbook#oom``);
    ``incident``: the class of the incident folder the log came from, said beside this one."""
    runbook = failure_ref(failure.cls.value)
    if as_json:
        answer = {"class": failure.cls.value, "sentence": failure.sentence, "evidence": failure.evidence,
                  "runbook": runbook}
        if incident is not None:
            answer["incident_class"] = incident
        return json.dumps(answer, ensure_ascii=False)
    lines = [
        f"class:    {failure.cls.value}",
        f"sentence: {failure.sentence}",
        f"evidence: {failure.evidence if failure.evidence is not None else '(no log line)'}",
        f"runbook:  {runbook} on sparkd's HTTP port (http://<node>:9479{runbook}); offline: "
        f"/usr/share/doc/sparkd/runbook.md",
    ]
    if incident == failure.cls.value:
        lines.append("incident: agrees (incident.json beside the log has the same class)")
    elif incident is not None:
        lines.append(f"incident: differs: incident.json beside the log has {incident}")
    return "\n".join(lines)
