"""Which event of a log is the cause of a death: the decision under `classify`. Pure.

Every event (`events.read_events`: the kernel's lines first, then the tail's) gets at most one finding — a class, a
tier and the "what happened" it supports — from two readers:

- the **families** (`families.py`): what the failure is by its structure and vocabulary — the exception's type, the
  subsystem it was raised in, an error code, the kind of line, the kinds of word the event holds together — each
  family's lowest-tier sign, some of them in words of their own that name facts (the port, the sizes, the module);
- the **rules** (`rules.py`): the lines whose meaning depends on the exit code, the context, what came before or their
  repetition, and the lines that say how vLLM ended rather than why (the consequences, a stop from outside).

Where both speak with one tier for one class the rule's reading is kept; otherwise the lower tier wins and, in a tie,
the family. A family of `families.BY_KIND` — an error decided only by its kind — speaks only where no rule does.

Then the cause: the lowest tier, and within a tier the first event in time, because the first specific error is the
root and the rest is fallout — except that an earlier event of an explaining class keeps its place over what it
explains (`EXPLAINS`: a peer lost before an NCCL timeout), and a reading of a traceback's frame yields to the specific
one of its class after it, or to the exception that ends its traceback when that is read as another class. A line
logged below ERROR is never a family's evidence nor the first error; only a rule or a sign written for such a line reads
it (a wait that repeats, a KV-cache budget at or below nothing). With no finding at all, vLLM's engine logging one line
again and again is a stall (`_repeating`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sparkd.supervisor.context import ClassifyContext
from sparkd.supervisor.events import Event, Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families import FamilyHit, judge
from sparkd.supervisor.logline import VLLM_HEADER, header_level
from sparkd.supervisor.peerloss import names_store_loss, store_owner_died_here
from sparkd.supervisor.rules import REBUILD, RULES, Rule, Tier, may_match
from sparkd.supervisor.sentences import NO_RETRY, quote
from sparkd.supervisor.tracebacks import PyException

__all__ = ["EXPLAINS", "Finding", "Scan", "scan"]

# An earlier line of the key's class explains a later one of these classes, whatever their tiers: a rank whose peer
# died (TCPStore closed, the peer's RPC gone) then times out in NCCL's watchdog or stops answering (issue 27).
EXPLAINS = {FailureClass.peer_lost: frozenset({FailureClass.nccl, FailureClass.hang})}
# A collective library reports the device's failure under it as its own, and the device's own words may come after
# (NCCL's `unhandled cuda error` then `Cuda failure 'out of memory'`; HCCL's init error code, then the NPU runtime's
# reason: the device is still held by an earlier process; or the port its root could not listen on, held by another
# process): a later finding of the device's or the port's, at the same tier or a lower one, explains the collective's
# before it.
EXPLAINED_BY_LATER = {FailureClass.nccl: frozenset({FailureClass.gpu_busy, FailureClass.oom, FailureClass.gpu_error,
                                                    FailureClass.port_in_use})}

_FAMILY_DO = {FailureClass.image_error: REBUILD,
              FailureClass.config_error: f"fix the vLLM settings in the config — {NO_RETRY}"}
_CHAIN_MARKERS = ("The above exception was the direct cause", "During handling of the above exception")


@dataclass(frozen=True)
class Finding:
    cls: FailureClass
    tier: Tier
    what: str | None  # None: the class's default
    do: str | None  # None: the class's default
    evidence: str  # the line (or exception) it rests on
    event: Event
    rule: Rule | None = None  # the rule that read it, when one did
    quoted: str | None = None  # the line it read, quoted, when `what` does not carry it
    specific: bool = False  # its "what" is its own words (a rule's, or a sign's that names facts)


@dataclass(frozen=True)
class Scan:
    best: Finding | None  # the cause: lowest tier, then earliest (an explaining cause first, EXPLAINS)
    first_exception: PyException | None  # the first exception that is no consequence, in an error line
    first_consequence: PyException | None  # the first exception of all, when every one is a consequence
    first_vllm_error: str | None  # the first message vLLM logged at ERROR (not a traceback's line)
    last_vllm_error: str | None  # the last one
    last_errorish: str | None  # the last line that looks like an error
    last_line: str | None  # the log's last line
    followed: Finding | None = None  # a later cause-level finding of another class that followed from the best
    first_errorish: str | None = None  # the first line that looks like an error, as its writer put it


_ABORTED = re.compile(r"exit code:? -6\b|\bSIGABRT\b")
_ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})
_ERRORISH = re.compile(r"\b(?:\w*Error|\w*Exception|Traceback|FATAL|Fatal|ERROR)\b")


def _rule(event: Event, exit_code: int | None, ctx: ClassifyContext, earlier: Sequence[str]
          ) -> tuple[Rule, re.Match[str]] | None:
    text = event.text
    if event.kind is Kind.code:
        return None
    low = text.lower()
    if not may_match(text, low):
        return None
    for rule in RULES:
        if not rule.may_match(text, low):
            continue
        m = rule.pattern.search(text)
        if m is None or (rule.when is not None and not rule.when(m, exit_code, ctx)):
            continue
        if rule.unless_after is not None and any(rule.unless_after.search(line) for line in earlier):
            continue
        return rule, m  # the first listed rule wins for a line
    return None


def _quoted(what: str | None, event: Event) -> str | None:
    """The line a rule read, quoted, when its "what happened" does not already carry it: the operator sees the cause
    as vLLM (or torch, NCCL, the kernel) put it."""
    exc = event.exception
    stated = event.said
    head = (exc.message if exc is not None and exc.message else stated)[:40].strip()
    if not head or (what is not None and head in what):
        return None
    return quote(stated)


_REASON_REACH = 60  # lines back a rule's reason is looked for (vLLM logs it just before: its platform probe)


def _reason(because: re.Pattern[str], earlier: Sequence[str]) -> str | None:
    """The latest of the lines just before that gives the reason a rule's line leaves out, quoted as its writer put it
    (vLLM's platform probe: `CUDA platform is not available because: NVML Shared Library Not Found`)."""
    for line in reversed(earlier[-_REASON_REACH:]):
        if because.search(line):
            return quote(VLLM_HEADER.sub("", line, count=1).strip())
    return None


def _from_family(hit: FamilyHit, event: Event) -> Finding:
    """A family's reading: a sign with words of its own rests on the line as logged (like a rule's), the others on
    the exception as Python printed it."""
    specific = hit.sign.what is not None
    evidence = event.exception.stated if event.exception is not None and not specific else event.text
    return Finding(hit.cls, hit.tier, hit.what, hit.do or _FAMILY_DO.get(hit.cls), evidence, event,
                   quoted=hit.quoted if hit.tier is not Tier.CONSEQUENCE else None, specific=specific)


def _finding(event: Event, exit_code: int | None, ctx: ClassifyContext, earlier: Sequence[str]) -> Finding | None:
    found = _reading(event, exit_code, ctx, earlier)
    if found is not None and event.exception is not None and event.exception.ignored:
        # Python ignored it (a destructor's at a teardown, after what ended the process): the cause only where the
        # log says nothing else
        return replace(found, tier=max(found.tier, Tier.AMBIGUOUS))
    return found


def _reading(event: Event, exit_code: int | None, ctx: ClassifyContext, earlier: Sequence[str]) -> Finding | None:
    matched = _rule(event, exit_code, ctx, earlier)
    rule_found = None
    if matched is not None:
        rule, m = matched
        what = rule.what(m, ctx) if rule.what is not None else None
        quoted = _quoted(what, event) if rule.tier is not Tier.CONSEQUENCE else None
        if rule.because is not None:
            quoted = _reason(rule.because, earlier) or quoted
        rule_found = Finding(rule.cls, rule.tier, what, rule.do, event.text, event, rule, quoted=quoted,
                             specific=True)
    hit = judge(event, ctx)
    if hit is None:
        return rule_found
    if hit.by_kind:
        return rule_found or _from_family(hit, event)
    if rule_found is None:
        return _from_family(hit, event)
    if rule_found.tier < hit.tier or (rule_found.cls is hit.cls and rule_found.tier == hit.tier):
        return rule_found
    return _from_family(hit, event)


def _without_peer(found: Finding, ctx: ClassifyContext, owner_died: bool) -> Finding:
    """A peer's loss read where the rank lost cannot be another node's (`peerloss.py`): on a node that runs vLLM
    alone, any; a TCPStore's loss where this engine's executor reports the death of rank 0, which serves it. It is
    then the echo of a death in this engine — the engine's, as a consequence: the death's own line, or any cause
    the log gives, says more."""
    if found.cls is not FailureClass.peer_lost:
        return found
    if ctx.group is False:
        why = "this node runs vLLM alone: the rank it lost was one of its own processes, not a peer"
    elif owner_died and names_store_loss(found.event.subject):
        why = "the TCPStore its ranks lost is served by rank 0, whose death this engine's executor reports"
    else:
        return found
    return Finding(FailureClass.engine_dead, Tier.CONSEQUENCE, f"A process of vLLM's engine went away ({why})", None,
                   found.evidence, found.event, quoted=found.quoted)


def _better(hit: Finding, best: Finding | None) -> bool:
    """Is `hit` (later than `best`) the better root cause? The lower tier, else the earlier — except that an earlier
    finding of an explaining class keeps its place over what it explains (`EXPLAINS`)."""
    if best is None:
        return True
    if hit.cls in EXPLAINS.get(best.cls, frozenset()):
        return False
    if hit.cls in EXPLAINED_BY_LATER.get(best.cls, frozenset()) and hit.tier <= best.tier:
        return True
    return hit.tier < best.tier


def _later_wait(hit: Finding, best: Finding | None) -> bool:
    """A line that shows up in healthy runs too repeats while vLLM waits (a placement group, the shared-memory
    queue, a rendezvous's retries): the last one says how long the wait was when vLLM died. A provisional reading
    (a traceback's frame, for an excerpt cut before its exception; a launcher's word for a stop) yields to a specific
    one of its class after it, which says more, and to the exception that ends its traceback when that is read as
    another class (`_ends_its_traceback`). And a rule that `overrides` (the driver's recovery action after an Xid)
    takes the place of an earlier finding of its class: it says what the device needs now."""
    if best is None:
        return False
    if hit.rule is not None and hit.rule.overrides and hit.cls is best.cls and hit.tier <= best.tier:
        return True
    if best.rule is not None and best.rule.provisional and hit.tier <= best.tier and _ends_its_traceback(hit, best):
        return True
    if best.rule is not None and best.rule.provisional and hit.cls is best.cls and hit.tier <= best.tier:
        return hit.specific
    return best.tier is Tier.AMBIGUOUS and hit.rule is not None and hit.rule is best.rule


def _ends_its_traceback(hit: Finding, best: Finding) -> bool:
    """`hit` is the exception that ends the traceback whose frame `best` read, and is read as another class: a frame's
    reading guesses the exception of an excerpt cut before it (the shared-memory queue's wait: a TimeoutError), and
    where the exception is there (the queue's read `cancelled` when a worker died) it says what the frame could not."""
    exc = hit.event.exception
    return (best.event.kind is Kind.frame and exc is not None and hit.cls is not best.cls
            and hit.event.process == best.event.process and any(f.path in best.event.text for f in exc.frames))


def _vllm_error(event: Event) -> str | None:
    """vLLM's own error message on this line, when it is one (not a line of a traceback vLLM logged)."""
    if event.kind is not Kind.vllm or event.exception is not None:
        return None
    m = VLLM_HEADER.match(event.text)
    if m is None or header_level(m) not in ("ERROR", "CRITICAL"):
        return None
    body = event.text[m.end():].strip()
    if not body or body.startswith(("Traceback", "File ", *_CHAIN_MARKERS)) or set(body) <= set("^~ "):
        return None
    return event.text


_REPEATS = 5  # the same line this many times in a row
# vLLM's front end waiting for its engine processes to come up (V1's `wait_for_engine_startup`, every 10 s)
_START_WAIT = re.compile(r"\bWaiting for \d+ local, \d+ remote core engine proc\(s\) to (?:start|connect)")
# lines that repeat by nature: a request log, the periodic stats of an idle engine (the stall rules read those)
_REPEATS_BY_NATURE = re.compile(r"\b(?:GET|POST|PUT|DELETE) /|Received request|Finished request|Added request|"
                                r"throughput|KV cache usage|[Mm]etrics")


def _repeating(events: Sequence[Event]) -> Finding | None:
    """With nothing else in the log: vLLM's engine logging the same line again and again, word for word (the same
    request, the same step), is an engine that goes round without progress — a stall, said only when nothing else
    is (a request log and an idle engine's periodic stats repeat by nature and are no such loop); vLLM's own wait for
    its start repeated (`Waiting for 1 local, 0 remote core engine proc(s) to start.`), a start that goes round
    waiting: a hang."""
    run, last, found = 0, None, None
    for event in events:
        said = event.said if event.kind is Kind.vllm and event.from_log else None
        run = run + 1 if said is not None and said == last else 1
        last = said
        if run >= _REPEATS and said and not _REPEATS_BY_NATURE.search(said):
            found = event
    if found is None:
        return None
    if _START_WAIT.search(found.said):
        what = (f"vLLM logged its wait for its start {_REPEATS} or more times in a row and went no further: the "
                "start is stuck")
        return Finding(FailureClass.hang, Tier.AMBIGUOUS, what, None, found.text, found, quoted=quote(found.said))
    what = f"vLLM's engine logged the same line {_REPEATS} or more times in a row and went no further"
    return Finding(FailureClass.stall, Tier.AMBIGUOUS, what, None, found.text, found, quoted=quote(found.said))


def scan(events: Sequence[Event], exit_code: int | None, ctx: ClassifyContext) -> Scan:
    best: Finding | None = None
    first_exception: PyException | None = None
    first_consequence: PyException | None = None
    first_vllm_error = last_vllm_error = last_errorish = first_errorish = None
    findings: list[Finding] = []
    earlier: list[str] = []
    owner_died = any(store_owner_died_here(e.text, e.process) for e in events if "VllmWorker-0" in e.text)
    for event in events:
        if (event.from_log and not event.below_error and event.kind not in (Kind.code, Kind.frame)
                and (_ERRORISH.search(event.text) or (event.kind in (Kind.torch, Kind.other, Kind.ray)
                                                       and event.level in _ERROR_LEVELS))):
            last_errorish = event.text
            first_errorish = first_errorish or event.said
        said = _vllm_error(event)
        first_vllm_error, last_vllm_error = first_vllm_error or said, said or last_vllm_error
        found = _finding(event, exit_code, ctx, earlier)
        found = _without_peer(found, ctx, owner_died) if found is not None else None
        earlier.append(event.text)
        exc = event.exception
        if exc is not None and first_exception is None and not event.below_error:
            if found is None or found.tier < Tier.CONSEQUENCE:
                first_exception = exc
            elif first_consequence is None:
                first_consequence = exc
        if found is None:
            continue
        findings.append(found)
        if _better(found, best) or _later_wait(found, best):
            best = found
    if best is not None and best.cls is FailureClass.engine_dead and _ABORTED.search(best.evidence):
        # a process that died of SIGABRT aborted itself, and NCCL's watchdog says why even when its line comes later
        best = next((f for f in findings if f.event.index > best.event.index and f.cls is FailureClass.nccl
                     and f.tier <= Tier.GENERIC), best)
    followed = None
    if best is not None:
        followed = next((f for f in findings if f.event.index > best.event.index and f.cls is not best.cls
                         and f.tier <= Tier.GENERIC), None)
    if best is None:
        best = _repeating(events)
    last_line = next((e.text for e in reversed(events) if e.from_log), None)
    return Scan(best, first_exception, first_consequence, first_vllm_error, last_vllm_error, last_errorish, last_line,
                followed, first_errorish)
