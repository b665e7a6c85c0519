"""sparkd's own lines in vLLM's log: where each attempt begins and what sparkd concluded. Pure.

vLLM's log (``vllm.log``, ``sparkctl logs``, an incident's ``log-tail.txt``) holds many launches one after another.
sparkd writes three kinds of line into it, each starting ``---- sparkd: ``:

- ``---- sparkd: launch <argv>`` before every launch;
- ``---- sparkd: preflight <check> failed`` when a preflight stops a launch, followed by the output of the program
  the check ran (vLLM's own parser: its traceback or argparse's complaint);
- ``---- sparkd: failure {"class": …, "sentence": …, "evidence": …}`` when sparkd records a failure: its verdict,
  as JSON. Some verdicts rest on nothing vLLM logged (a canary that got no answer, the memory guard, the peer's
  word), so the log alone could not say them again.

An **attempt** is the lines from the last launch or preflight line on. The daemon classifies a death from the
launch's own lines (:func:`this_launch`), an incident keeps the attempt's lines only (:func:`attempt`), and
``sparkd explain`` reads from the last attempt line and, when sparkd's verdict is there, says it again
(:func:`verdict`), so both give the same class for the same failure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LAUNCH_LINE", "MARK", "PREFLIGHT_LINE", "STOP_LINE", "VERDICT_LINE", "Verdict", "attempt", "preflight_line",
           "this_launch", "verdict", "verdict_line", "vllm_lines"]

MARK = "---- sparkd: "
LAUNCH_LINE = MARK + "launch "  # written into the vLLM log before every launch
PREFLIGHT_LINE = MARK + "preflight "
VERDICT_LINE = MARK + "failure "
STOP_LINE = MARK + "stop "  # after every stop: what sparkd sent (sparkd.supervisor.stopreport)


@dataclass(frozen=True)
class Verdict:
    cls: str
    sentence: str
    evidence: str | None


def preflight_line(check: str) -> str:
    return f"{PREFLIGHT_LINE}{check} failed"


def verdict_line(cls: str, sentence: str, evidence: str | None) -> str:
    return VERDICT_LINE + json.dumps({"class": cls, "sentence": sentence, "evidence": evidence}, ensure_ascii=False)


def this_launch(tail: Sequence[str]) -> list[str]:
    """The lines of ``tail`` since the last launch line: an earlier instance's errors never classify this death
    (and a short-lived instance is classified from its few lines, not 300). No launch line (an adopted instance):
    the whole tail."""
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].startswith(LAUNCH_LINE):
            return list(tail[i + 1:])
    return list(tail)


def attempt(tail: Sequence[str]) -> list[str]:
    """The lines of the last attempt: from the last launch or preflight line on, that line included."""
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].startswith((LAUNCH_LINE, PREFLIGHT_LINE)):
            return list(tail[i:])
    return list(tail)


def vllm_lines(lines: Sequence[str]) -> list[str]:
    """``lines`` without sparkd's own."""
    return [line for line in lines if not line.startswith(MARK)]


def verdict(lines: Sequence[str]) -> Verdict | None:
    """sparkd's last verdict in ``lines``, if one is there and reads."""
    for line in reversed(lines):
        if not line.startswith(VERDICT_LINE):
            continue
        try:
            data = json.loads(line[len(VERDICT_LINE):])
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("class"), str) and isinstance(data.get("sentence"), str):
            evidence = data.get("evidence")
            return Verdict(data["class"], data["sentence"], evidence if isinstance(evidence, str) else None)
    return None
