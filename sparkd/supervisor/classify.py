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
4. Otherwise the kernel's evidence and the log tail are matched against the catalogue in `rules.py`: Docker's
   OOMKilled and the kernel-log lines of `ClassifyContext` count as lines logged before the tail (a kernel OOM
   kill or an Xid is the root of what vLLM logs after it). The lowest tier wins; within a tier the earliest
   line, because the first specific error is the cause and the rest is fallout.
5. When the winner is a consequence (`Engine core initialization failed`, `EngineDeadError`, ...), the first
   Python exception line in the tail that is not itself a consequence (`KeyError: 'model.embed'`) is the
   cause: it becomes the evidence and the sentence names it. "No earlier cause" is said only when there is none.
   The one consequence that is its own cause is a stop from outside (the API server's SIGTERM/SIGINT line):
   `unknown`, resting on that line, unless an engine death was logged before it.
6. Nothing matched: exit 0 is still a failure (vLLM exits 0 after engine death) → `engine_dead`; a signal
   or other exit code → `unknown`, with the first exception line named when there is one.

Every sentence is "what happened (how it ended); what to do." Facts from `ClassifyContext` (launch target,
ports, MemAvailable, peer) make it specific.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.families import FamilyHit, TracebackReader
from sparkd.supervisor.logline import segments_of
from sparkd.supervisor.rules import ANY, INIT_FAILED, REBUILD, RULES, Rule, Tier
from sparkd.supervisor.sentences import NO_RETRY, default_do, default_what, mem_note

__all__ = ["MAX_SCAN_LINES", "ClassifyContext", "classify"]


# Only the tail matters, and a supervisor may hand over a long buffer.
MAX_SCAN_LINES = 2000
_MAX_EVIDENCE_CHARS = 500

# For `unknown`: the last line that looks like an error is the best evidence there is.
_ERRORISH = re.compile(r"\b(?:\w*Error|\w*Exception|Traceback|FATAL|Fatal|ERROR)\b")
# A Python exception's summary line, after vLLM's header: `KeyError: 'x'`, `torch.OutOfMemoryError: ...`.
_EXCEPTION = re.compile(
    r"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] )?"
    r"(?P<line>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*)?)$"
)
_OOM_KILLED = "docker inspect: State.OOMKilled=true"
# vLLM's header at a level below ERROR: such a line (a startup warning quoting `OSError: [Errno 24]` as an example)
# is never the evidence of a death, nor its first error
_BELOW_ERROR = re.compile(r"(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d")
_FAMILY_DO = {FailureClass.image_error: REBUILD,
              FailureClass.config_error: f"fix the vLLM settings in the config — {NO_RETRY}"}
# Signals a process raises on itself when it faults (a segfault, an abort from a C++ assertion or NCCL).
_CRASH_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGABRT})


@dataclass(frozen=True)
class _Match:
    rule: Rule
    match: re.Match[str]
    text: str
    index: int  # position in the scan (kernel evidence comes first)


@dataclass(frozen=True)
class _Scan:
    best: _Match | None  # the root-cause match: lowest tier, then earliest (an explaining cause first, _EXPLAINS)
    first_exception: tuple[int, str] | None  # the first exception line that is no consequence
    last_errorish: str | None
    followed: _Match | None = None  # a later cause-level line of another class that followed from the best one


# An earlier line of the key's class explains a later one of these classes, whatever their tiers: a rank whose peer
# died (TCPStore closed, the peer's RPC gone) then times out in NCCL's watchdog or stops answering (issue 27).
_EXPLAINS = {FailureClass.peer_lost: frozenset({FailureClass.nccl, FailureClass.hang})}


def _match(text: str, exit_code: int | None, ctx: ClassifyContext, earlier: Sequence[str] = ()
           ) -> tuple[Rule, re.Match[str]] | None:
    if not ANY.search(text):
        return None
    for rule in RULES:
        m = rule.pattern.search(text)
        if m is None or (rule.when is not None and not rule.when(m, exit_code, ctx)):
            continue
        if rule.unless_after is not None and any(rule.unless_after.search(line) for line in earlier):
            continue
        return rule, m  # the first listed rule wins for a line
    return None


def _evidence_lines(log_tail: Sequence[str], ctx: ClassifyContext) -> list[tuple[str, bool, str | None]]:
    """(line, from_the_log, process) in scan order: the kernel's evidence first, then the tail's frames."""
    lines: list[tuple[str, bool, str | None]] = []
    if ctx.oom_killed:
        lines.append(("OOMKilled: true", False, None))
    lines += [(line, False, None) for line in ctx.kernel_lines]
    for raw in log_tail[max(0, len(log_tail) - MAX_SCAN_LINES):]:
        frames, process = segments_of(raw)
        lines += [(text, True, process) for text in frames]
    return lines


def _family_match(hit: FamilyHit, text: str) -> tuple[Rule, re.Match[str]] | None:
    do = _FAMILY_DO[hit.cls]
    rule = Rule(hit.cls, Tier.CAUSE, re.compile(re.escape(hit.exception)), lambda m, ctx: hit.what, do)
    m = rule.pattern.search(text)
    return (rule, m) if m is not None else None


def _better(hit: _Match, best: _Match | None) -> bool:
    """Is `hit` (later in the scan than `best`) the better root cause? The lower tier, else the earlier line — except
    that an earlier line of an explaining class keeps its place over what it explains (`_EXPLAINS`)."""
    if best is None:
        return True
    if hit.rule.cls in _EXPLAINS.get(best.rule.cls, frozenset()):
        return False
    return (hit.rule.tier, hit.index) < (best.rule.tier, best.index)


def _scan(log_tail: Sequence[str], exit_code: int | None, ctx: ClassifyContext) -> _Scan:
    best: _Match | None = None
    first_exception: tuple[int, str] | None = None
    last_errorish: str | None = None
    hits: list[_Match] = []
    readers: dict[str | None, TracebackReader] = {}
    earlier: list[str] = []
    for index, (text, from_log, process) in enumerate(_evidence_lines(log_tail, ctx)):
        below_error = from_log and _BELOW_ERROR.match(text) is not None  # a warning explains no death
        if from_log and not below_error and _ERRORISH.search(text):
            last_errorish = text
        hit = _match(text, exit_code, ctx, earlier)
        family = readers.setdefault(process, TracebackReader()).feed(text) if from_log else None
        # a traceback's family names a line no rule explains better (a rule of the same class keeps its tier: a
        # pydantic ValidationError's detail, on a later line, is the better evidence)
        if family is not None and (hit is None or (hit[0].tier > Tier.CAUSE and hit[0].cls is not family.cls)):
            hit = _family_match(family, text) or hit
        if from_log and not below_error and first_exception is None and (hit is None or hit[0].tier < Tier.CONSEQUENCE):
            m = _EXCEPTION.match(text)
            if m is not None:
                first_exception = (index, m.group("line"))
        earlier.append(text)
        if hit is None:
            continue
        found = _Match(hit[0], hit[1], _OOM_KILLED if text == "OOMKilled: true" and not from_log else text, index)
        hits.append(found)
        if _better(found, best):
            best = found
    followed = None
    if best is not None:
        followed = next((h for h in hits if h.index > best.index and h.rule.cls is not best.rule.cls
                         and h.rule.tier <= Tier.GENERIC), None)
    return _Scan(best, first_exception, last_errorish, followed)


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


def _quote(line: str, limit: int = 200) -> str:
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return f"`{line}`"


def _launch_error(exit_code: int, hit: _Match | None, ctx: ClassifyContext) -> tuple[str, str]:
    """What and do for exit 126/127, preferring a log line that names the culprit."""
    if hit is not None and hit.rule.cls is FailureClass.config_error and hit.rule.what is not None:
        return hit.rule.what(hit.match, ctx), hit.rule.do or default_do(FailureClass.config_error)
    target = ctx.launch_target
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
                 ) -> Failure:
        middle = f" ({self.how})" if self.how and with_how else ""
        return Failure(cls, f"{what}{middle}; {do}.", self.exit_code, self.sig, _evidence(evidence))


def _from_hint(hint: FailureClass, scan: _Scan, ctx: ClassifyContext, make: _Sentence) -> Failure:
    hit = scan.best
    evidence = hit.text if hit is not None else None
    if hit is not None and hit.rule.cls is hint and hit.rule.what is not None:
        return make(hint, hit.rule.what(hit.match, ctx), hit.rule.do or default_do(hint), evidence)
    what = default_what(hint)
    if hint in (FailureClass.oom, FailureClass.killed_by_guard):
        what += mem_note(ctx)
    return make(hint, what, default_do(hint), evidence)


def _from_rule(scan: _Scan, ctx: ClassifyContext, make: _Sentence) -> Failure:
    assert scan.best is not None
    hit = scan.best
    rule = hit.rule
    what = rule.what(hit.match, ctx) if rule.what is not None else default_what(rule.cls)
    evidence = hit.text
    # A consequence that is no failure of vLLM's (`unknown`: the stop from outside) is its own cause: what vLLM
    # logged before it did not end it (an engine death logged first wins as the earlier consequence), what it
    # logged after is the stop's fallout.
    if rule.tier is Tier.CONSEQUENCE and rule.cls is not FailureClass.unknown:
        if scan.first_exception is not None:
            evidence = scan.first_exception[1]
            what += f"; the first error in the log is {_quote(evidence)}"
        elif what == INIT_FAILED:
            what += " and no earlier cause is in the log tail"
    followed = scan.followed
    if followed is not None and followed.rule.cls in _EXPLAINS.get(rule.cls, frozenset()):
        what += f"; {_quote(followed.text)} came after it, as its consequence"
    return make(rule.cls, what, rule.do or default_do(rule.cls), evidence)


def _unmatched(scan: _Scan, ctx: ClassifyContext, make: _Sentence) -> Failure:
    named = f"; the first error in the log is {_quote(scan.first_exception[1])}" if scan.first_exception else ""
    evidence = scan.first_exception[1] if scan.first_exception else scan.last_errorish
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
    if scan.first_exception is not None:
        what = f"vLLM stopped with an error sparkd does not recognise: {_quote(scan.first_exception[1])}"
    elif make.exit_code is None:
        what = "vLLM went away and its exit status is unknown"
    else:
        what = default_what(FailureClass.unknown)
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
    scan = _scan(log_tail, exit_code, ctx)
    if hint is not None:
        return _from_hint(hint, scan, ctx, make)
    if ctx.engine_gone:
        return make(FailureClass.host_unavailable, "vLLM ended while its container engine went away (stopping or "
                    "restarting)", "sparkd waits for the engine and launches vLLM again when it is back, without "
                    "spending the restart budget", scan.best.text if scan.best is not None else None)
    if exit_code in (126, 127) and signal is None:
        what, do = _launch_error(exit_code, scan.best, ctx)
        return make(FailureClass.config_error, what, do, scan.best.text if scan.best is not None else None)
    if scan.best is not None:
        return _from_rule(scan, ctx, make)
    return _unmatched(scan, ctx, make)
