"""The safety net that needs no rule: the same failure twice in a row before ``ready`` will not go away by retrying.

A failure's first evidence line (the log line its class rests on) is normalised — vLLM's header and timestamps,
numbers, hexadecimal ids and temporary names taken out — into a signature. The restart policy keeps the last one
of the current unready streak; when the next failure before ``ready`` has the same signature, it gives up with a
sentence that quotes the line. Whatever no rule recognises (a new exception, an ``unknown``) is caught as well as
what one does. Pure.
"""

from __future__ import annotations

import re
import signal as _signal

from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.logline import VLLM_HEADER

__all__ = ["comparable", "quote", "signature"]

# Not compared: a rendezvous that timed out waits on another node, which comes up on its own time; a kill from
# outside (SIGKILL, SIGTERM by someone) says nothing about the next launch.
_WAITS_ON_OTHERS = frozenset({FailureClass.rendezvous_timeout})
_OUTSIDE_SIGNALS = frozenset({_signal.SIGKILL, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT})

_DIGITS = re.compile(r"[0-9a-fA-F]*\d[0-9a-fA-F]*(?:\.[0-9a-fA-F]*\d[0-9a-fA-F]*)*")  # numbers, hex ids, versions
_SPACE = re.compile(r"\s+")


def signature(evidence: str | None) -> str | None:
    """The normalised form of a failure's evidence line; None when there is none to compare."""
    if evidence is None or not evidence.strip():
        return None
    text = VLLM_HEADER.sub("", evidence.strip())
    text = _DIGITS.sub("#", text)
    return _SPACE.sub(" ", text).strip()


def comparable(failure: Failure) -> str | None:
    """The evidence of ``failure`` the safety net may compare, or None when a repeat of it proves nothing."""
    if failure.cls in _WAITS_ON_OTHERS:
        return None
    if failure.cls is FailureClass.unknown and failure.signal in _OUTSIDE_SIGNALS:
        return None
    return failure.evidence


def quote(evidence: str, limit: int = 200) -> str:
    line = " ".join(evidence.split())
    return f"`{line if len(line) <= limit else line[: limit - 1] + '…'}`"
