"""Failure classification: why did vLLM stop, in one class and one sentence.

`classify(exit_code, signal, log_tail, context=...)` is a pure function of what the supervisor observed when a
vLLM process ended (or was ended). The daemon and `sparkd explain` call it the same way. Rules, in order:

1. A `hint` wins. The supervisor passes one when it knows the class from elsewhere: the memory guard killed
   the process (`killed_by_guard`), a probe saw 503 (`engine_dead`), the canary or metrics saw a wedge
   (`hang`, `stall`), the peer reported its rank gone (`peer_lost`). The log is still scanned for evidence.
2. The container engine vLLM ran under took no new connection when it ended (`engine_gone`): the engine was
   stopping or restarting and took its containers with it — `host_unavailable`, a wait, whatever the log says.
3. Exit 126/127 is a config error: the launch target is missing or not executable, or a command in it
   was not found. vLLM never ran, so there is no vLLM log to read.
4. Otherwise the log is read as events (`events.py`: Docker's OOMKilled and the kernel-log lines of
   `ClassifyContext` first, as logged before the tail — a kernel OOM kill or an Xid is the root of what vLLM logs
   after it; every Python traceback parsed, `tracebacks.py`), each event read by the families (`families.py`) and
   the rules (`rules.py`), and the cause picked (`cause.py`): the lowest tier wins; within a tier the earliest
   event, because the first specific error is the cause and the rest is fallout.
5. When the winner is a consequence (`Engine core initialization failed`, `EngineDeadError`, ...), the first
   Python exception in the tail that is not itself a consequence (`KeyError: 'model.embed'`) is the cause: it
   becomes the evidence and the sentence names it and where it was raised. "No earlier cause" is said only when
   there is none, and then the consequence quotes itself. The one consequence that is its own cause is a stop from
   outside (the API server's SIGTERM/SIGINT line, a KeyboardInterrupt): `unknown`, resting on that line, unless an
   engine death was logged before it.
6. Nothing matched: exit 0 is still a failure (vLLM exits 0 after engine death) → `engine_dead`; a signal
   or other exit code → `unknown`, naming the root exception and where it was raised, or vLLM's first error
   line, and vLLM's last error line — never nothing when the log has an error.

Every sentence is "what happened (how it ended); what to do." Facts from `ClassifyContext` (launch target,
ports, MemAvailable, peer) make it specific.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Sequence

from sparkd.supervisor.cause import EXPLAINS, Finding, Scan, scan
from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.logline import VLLM_HEADER
from sparkd.supervisor.rules import INIT_FAILED, Tier
from sparkd.supervisor.sentences import NO_RETRY, default_do, default_what, mem_note, quote
from sparkd.supervisor.tracebacks import PyException

__all__ = ["MAX_SCAN_LINES", "ClassifyContext", "classify"]


# Only the tail matters, and a supervisor may hand over a long buffer.
MAX_SCAN_LINES = 2000
_MAX_EVIDENCE_CHARS = 500
# Signals a process raises on itself when it faults (a segfault, an abort from a C++ assertion or NCCL).
_CRASH_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGABRT})


def _signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _how(exit_code: int | None, sig: int | None) -> str | None:
    if sig is not None:
        return f"killed by {_signal_name(sig)}"
    if exit_code is not None:
        return f"exit {exit_code}"
    return None


def _evidence(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _MAX_EVIDENCE_CHARS else text[: _MAX_EVIDENCE_CHARS - 1] + "…"


def _launch_error(exit_code: int, hit: Finding | None, target: str | None) -> tuple[str, str]:
    """What and do for exit 126/127, preferring a log line that names the culprit."""
    if hit is not None and hit.cls is FailureClass.config_error and hit.specific and hit.what is not None:
        return hit.what, hit.do or default_do(FailureClass.config_error)
    do = f"fix [launch] in the config — {NO_RETRY}"
    if exit_code == 126:
        name = f"The launch target {target}" if target else "The launch target"
        return f"{name} is not executable", f"make it executable or fix [launch] in the config — {NO_RETRY}"
    if target:
        return f"The launch target {target} does not exist", do
    return "The launch target or a command it runs does not exist", do


class _Sentence:
    """Builds the one Failure from what happened, how the process ended and what to do."""

    def __init__(self, exit_code: int | None, sig: int | None) -> None:
        self.exit_code, self.sig = exit_code, sig
        self.how = _how(exit_code, sig)

    def __call__(self, cls: FailureClass, what: str, do: str, evidence: str | None, *, with_how: bool = True,
                 quoted: str | None = None) -> Failure:
        middle = f" ({self.how})" if self.how and with_how else ""
        said = f": {quoted}" if quoted else ""
        return Failure(cls, f"{what}{middle}{said}; {do}.", self.exit_code, self.sig, _evidence(evidence))


def _from_hint(hint: FailureClass, found: Scan, ctx: ClassifyContext, make: _Sentence) -> Failure:
    hit = found.best
    evidence = hit.evidence if hit is not None else None
    if hit is not None and hit.cls is hint and hit.what is not None:
        return make(hint, hit.what, hit.do or default_do(hint), evidence, quoted=hit.quoted)
    what = default_what(hint)
    if hint in (FailureClass.oom, FailureClass.killed_by_guard):
        what += mem_note(ctx)
    return make(hint, what, default_do(hint), evidence)


def _from_finding(found: Scan, make: _Sentence) -> Failure:
    assert found.best is not None
    hit = found.best
    what = hit.what if hit.what is not None else default_what(hit.cls)
    evidence = hit.evidence
    # A consequence that is no failure of vLLM's (`unknown`: the stop from outside) is its own cause: what vLLM
    # logged before it did not end it (an engine death logged first wins as the earlier consequence), what it
    # logged after is the stop's fallout.
    quoted = hit.quoted
    if hit.tier is Tier.CONSEQUENCE and hit.cls is not FailureClass.unknown:
        if found.first_exception is not None:
            evidence = found.first_exception.stated
            what += f"; the first error in the log is {quote(evidence)}{_raised(found.first_exception.where)}"
        else:  # the consequence is all the log says: quote it, as Python printed it where it did
            first = found.first_consequence
            said = first.stated if first is not None and not _says_more(hit, first) else hit.evidence
            what += " and no earlier cause is in the log tail" if what == INIT_FAILED else ""
            quoted = quote(VLLM_HEADER.sub("", said, count=1))
    followed = found.followed
    if followed is not None and followed.cls in EXPLAINS.get(hit.cls, frozenset()):
        what += f"; {quote(followed.evidence)} came after it, as its consequence"
    return make(hit.cls, what, hit.do or default_do(hit.cls), evidence, quoted=quoted)


def _says_more(hit: Finding, first: PyException | None) -> bool:
    """Whether a consequence's own line says more than the first consequence Python printed: it does when there is
    none, and when that exception came later, is another one and the line names who died (not 'failed to start')."""
    if first is None:
        return True
    same = bool(first.message) and first.message[:40] in hit.evidence
    return first.index > hit.event.index and not same and hit.what != INIT_FAILED


def _raised(where: str | None) -> str:
    return f" (raised in {where})" if where else ""


def _message(line: str) -> str:
    return VLLM_HEADER.sub("", line, count=1).strip()


def _what_happened(found: Scan) -> str:
    """For a death no family or rule explains: the root exception, where it was raised, and vLLM's last error line
    when it says something else; with no exception and no error of vLLM's, the first and the last line of any writer
    that looks like an error — never nothing, when the log has an error at all."""
    exc = found.first_exception
    parts = []
    if exc is not None:
        root = exc.root
        parts.append(f"the first error in the log is {quote(root.stated)}{_raised(root.where)}")
    first, last = found.first_vllm_error, found.last_vllm_error
    if exc is None and first is not None:
        parts.append(f"the first error vLLM logged is {quote(_message(first))}")
    if last is not None and last != first and (exc is None or exc.root.message[:40] not in last):
        parts.append(f"vLLM's last error line is {quote(_message(last))}")
    elif exc is None and first is None and found.last_errorish is not None:
        earliest = found.first_errorish
        if earliest is not None and earliest not in found.last_errorish:  # any writer's first error, then its last
            parts.append(f"the first error-looking line is {quote(earliest)}")
        parts.append(f"the last error-looking line is {quote(found.last_errorish)}")
    elif exc is None and first is None and found.last_line is not None:
        parts.append(f"the log's last line is {quote(found.last_line)}")
    return "; ".join(parts)


# A log that stops with no error and no word of how its process ended: the process may still run, stuck
_STOPS_DO = ("if vLLM still runs, it is stuck there — on a node sparkd names that by the start's deadline, or by the "
             "canary and the step probe while it serves; if it ended, give `--exit-code` or `--signal`")


def _unmatched(found: Scan, ctx: ClassifyContext, make: _Sentence) -> Failure:
    said = _what_happened(found)
    named = f"; {said}" if said else ""
    exc = found.first_exception
    evidence = exc.root.stated if exc is not None else (found.first_vllm_error or found.last_errorish)
    if make.exit_code == 0 and make.sig is None:
        if ctx.was_ready is False:
            what = "vLLM exited with status 0 before it was ready and logged no error"
        else:
            what = "vLLM exited with status 0 without being asked to, which it does after its engine dies"
        return make(FailureClass.engine_dead, what + named, default_do(FailureClass.engine_dead), evidence,
                    with_how=False)
    if make.sig in _CRASH_SIGNALS:
        what = (f"vLLM crashed with {_signal_name(make.sig)}: a fault inside vLLM or one of its native libraries "
                "(CUDA, NCCL, a kernel extension), not a kill from outside")
        do = "the log tail in the incident folder ends at the crash — sparkd restarts with backoff"
        return make(FailureClass.unknown, what + named, do, evidence, with_how=False)
    if make.sig is not None:
        what = (f"vLLM was killed by {_signal_name(make.sig)} from outside sparkd "
                "(the kernel OOM killer, earlyoom or a person)")
        do = "check the kernel log (`journalctl -k`) for an OOM kill — sparkd restarts with backoff"
        return make(FailureClass.unknown, what + named, do, evidence, with_how=False)
    if exc is not None:
        what = (f"vLLM stopped with an error sparkd does not recognise: {quote(exc.root.stated)}"
                f"{_raised(exc.root.where)}")
        last = found.last_vllm_error
        if last is not None and exc.root.message[:40] not in last:
            what += f"; vLLM's last error line is {quote(_message(last))}"
    elif make.exit_code is None and make.sig is None and not ctx.ended_known and found.last_line is not None and \
            found.first_vllm_error is None and found.last_errorish is None:
        what = f"The log stops without an error at {quote(found.last_line)}, and how vLLM ended is not given"
        return make(FailureClass.unknown, what, _STOPS_DO, evidence)
    elif make.exit_code is None:
        what = "vLLM went away and its exit status is unknown" + named
    else:
        what = default_what(FailureClass.unknown) + named
    return make(FailureClass.unknown, what, default_do(FailureClass.unknown), evidence)


def classify(
    exit_code: int | None,
    signal: int | None,
    log_tail: Sequence[str],
    *,
    hint: FailureClass | None = None,
    context: ClassifyContext | None = None,
) -> Failure:
    """Classify one ended vLLM process.

    `exit_code` and `signal` are as observed (a Popen returncode of -N is `signal=N`); an exit code of 128+N
    with no signal is read as death by signal N, the way shells and `docker exec` report it. `log_tail` is
    the last lines of the process's output, raw (colour, process prefixes and `\\r` frames are handled here).
    """
    ctx = context or ClassifyContext()
    sig = signal
    if sig is None and exit_code is not None and 128 < exit_code <= 128 + 64:
        sig = exit_code - 128
    make = _Sentence(exit_code, sig)
    tail = log_tail[max(0, len(log_tail) - MAX_SCAN_LINES):]
    found = scan(read_events(tail, ctx.kernel_lines, ctx.oom_killed), exit_code, ctx)
    evidence = found.best.evidence if found.best is not None else None
    if hint is not None:
        return _from_hint(hint, found, ctx, make)
    if ctx.engine_gone:
        return make(FailureClass.host_unavailable, "vLLM ended while its container engine went away (stopping or "
                    "restarting)", "sparkd waits for the engine and launches vLLM again when it is back, without "
                    "spending the restart budget", evidence)
    if exit_code in (126, 127) and signal is None:
        what, do = _launch_error(exit_code, found.best, ctx.launch_target)
        return make(FailureClass.config_error, what, do, evidence)  # the shell's line says it all
    if found.best is not None:
        return _from_finding(found, make)
    return _unmatched(found, ctx, make)
