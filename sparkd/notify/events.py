"""What a person is told, as a function of what changed. Pure: no clock, no I/O.

The notifier's input is a state change, ``(before, after)``, each a :class:`Snapshot` of one node's lifecycle (built
from the core's :class:`~sparkd.supervisor.states.Machine` by :func:`snapshot`). :func:`events` turns one change into
the events it means; the memory guard's actions come from the guard's own decisions (:func:`guard_event`), since a
stop the guard makes shows in the lifecycle only as the failure it causes. Where each event comes from:

=================  ==============================================================  ==========
event              the change                                                      severity
=================  ==============================================================  ==========
watching           the daemon's first state after ``adopting`` (or its first        info
                   snapshot): sparkd started and says what it found
failure            a new last failure (its class and sentence); a wait's (a class     warning
                   that spends no restart budget: the peer gone, the host not
                   ready) only when it begins, not at each try while it lasts
breaker_open       the lifecycle enters ``failed`` (the failure that opened it)     critical
reboot_needed      the breaker opens on ``reboot_needed``                           critical
answers_changed    the answers verdict appears or changes (issue 37), or a          critical
                   failure of class ``answers_changed``
recovered          serving again (``ready`` from any state that does not serve),   info
                   the launch being a restart after a failure (named by the
                   failure that began the outage, when the caller kept it)
guard              the memory guard stops, kills or plans a restart (critical,     as said
                   warning) or refuses a start / warns (warning)
held_back          the rate limiter's summary of what it held back                 the worst
=================  ==============================================================  ==========

A failure that opens the breaker in the same step (a preflight's) is said once, as the breaker's event (with its
class and sentence); a running vLLM's failure is said when it happens, and the breaker when its stop is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sparkd.config.notify import Severity
from sparkd.supervisor.failures import TREATMENT, Budget, Failure, FailureClass
from sparkd.supervisor.states import SERVING, Machine, State

__all__ = ["Event", "EventKind", "Snapshot", "events", "guard_event", "snapshot"]

ANSWERS_CHANGED = "answers_changed"  # issue 37's verdict (a failure class or a verdict of its own)


class EventKind(StrEnum):
    watching = "watching"
    failure = "failure"
    breaker_open = "breaker_open"
    reboot_needed = "reboot_needed"
    answers_changed = "answers_changed"
    recovered = "recovered"
    guard = "guard"
    held_back = "held_back"


@dataclass(frozen=True)
class Event:
    """One thing to tell. ``anchor``: the runbook section (``/runbook#<anchor>``) that says what to do."""

    kind: EventKind
    severity: Severity
    node: str
    title: str  # one line
    text: str  # the sentence(s)
    failure_class: str | None = None
    anchor: str | None = None
    at: float | None = None  # wall time, set when it is posted
    counts: dict[str, int] = field(default_factory=dict)  # held_back: what was held back, by kind

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "severity": self.severity.value, "node": self.node,
                               "title": self.title, "text": self.text, "class": self.failure_class,
                               "anchor": self.anchor, "at": self.at}
        if self.counts:
            out["held_back"] = dict(self.counts)
        return out


@dataclass(frozen=True)
class Snapshot:
    """What the notifier reads of one node's state."""

    node: str
    state: State
    failure: Failure | None = None  # the last failure (a new object each time one happens)
    breaker_reason: str | None = None
    restart_reason: str | None = None  # why the current launch is a restart: a failure class, operator, reset
    pid: int | None = None
    answers: str | None = None  # the answers_changed verdict's sentence while it stands (issue 37)


def snapshot(node: str, machine: Machine, *, pid: int | None = None, answers: str | None = None) -> Snapshot:
    return Snapshot(node, machine.state, machine.last_failure, machine.breaker_reason, machine.restart_reason, pid,
                    answers)


def events(before: Snapshot | None, after: Snapshot, *, cause: str | None = None) -> list[Event]:
    """The events one change of state means, in the order they happened. ``cause``: the class of the failure that
    began the outage this change may end (the notifier keeps it), else the last failure's class names it."""
    if after.state is State.adopting:
        return []
    if before is None or before.state is State.adopting:
        return [_watching(after)]
    out: list[Event] = []
    new_failure = after.failure is not None and after.failure is not before.failure
    opened = after.state is State.failed and before.state is not State.failed
    if opened:
        out.append(_breaker(after))
    elif new_failure and after.failure is not None and not _waits_on(before.failure, after.failure):
        out.append(_failure(after.node, after.failure))
    if after.answers and after.answers != before.answers:
        out.append(Event(EventKind.answers_changed, Severity.critical, after.node,
                         f"vLLM on {after.node}: its answers changed", after.answers, ANSWERS_CHANGED, ANSWERS_CHANGED))
    if _recovered(before, after):
        cls = cause or after.restart_reason
        out.append(Event(EventKind.recovered, Severity.info, after.node, f"vLLM on {after.node} serves again",
                         f"vLLM on {after.node} is ready again after {_a(cls)} {cls} failure"
                         + (f" (pid {after.pid})." if after.pid else "."), cls))
    return out


def _a(word: str | None) -> str:
    return "an" if word and word[0] in "aeiou" else "a"


def _waits_on(before: Failure | None, failure: Failure) -> bool:
    """``failure`` is one more try of a wait already said (the same class, which spends no restart budget)."""
    return (before is not None and before.cls is failure.cls
            and TREATMENT[failure.cls].budget is Budget.none)


def _recovered(before: Snapshot, after: Snapshot) -> bool:
    return (after.state is State.ready and before.state not in SERVING
            and after.restart_reason in FailureClass.__members__)


def _watching(s: Snapshot) -> Event:
    what = {
        State.stopped: "vLLM is stopped",
        State.preflight: "vLLM is being started",
        State.starting: f"vLLM is starting (pid {s.pid})" if s.pid else "vLLM is starting",
        State.ready: "vLLM serves",
        State.backoff: "vLLM waits to start again",
        State.failed: f"the restart breaker is OPEN: {s.breaker_reason}",
    }.get(s.state, f"vLLM is {s.state.value}")
    return Event(EventKind.watching, Severity.info, s.node, f"sparkd started watching {s.node}",
                 f"sparkd started watching vLLM on {s.node}: {what}. Silence from here on means nothing failed.")


def _failure(node: str, failure: Failure) -> Event:
    kind = EventKind.answers_changed if failure.cls.value == ANSWERS_CHANGED else EventKind.failure
    severity = Severity.critical if kind is EventKind.answers_changed else Severity.warning
    return Event(kind, severity, node, f"vLLM on {node} failed: {failure.cls.value}", failure.sentence,
                 failure.cls.value, failure.cls.value)


def _breaker(s: Snapshot) -> Event:
    failure = s.failure
    cls = failure.cls.value if failure is not None else None
    said = f" The last failure ({cls}): {failure.sentence}" if failure is not None else ""
    if cls == FailureClass.reboot_needed.value:
        return Event(EventKind.reboot_needed, Severity.critical, s.node, f"{s.node} needs a reboot",
                     f"sparkd stopped restarting vLLM on {s.node}: {s.breaker_reason}.{said} Reboot the node, then "
                     "`sparkctl reset`.", cls, "sparkdrebootneeded")
    return Event(EventKind.breaker_open, Severity.critical, s.node, f"vLLM on {s.node} gave up restarting",
                 f"The restart breaker on {s.node} is open: {s.breaker_reason}.{said} Nothing serves until someone "
                 "acts: fix the cause, then `sparkctl reset`.", cls, "sparkdbreakeropen")


# The guard's actions (``sparkd.guard.policy.Action`` values) a person hears of, and how loudly.
_GUARD = {
    "stop": (Severity.critical, "stopped vLLM", "sparkdguardkilled"),
    "kill": (Severity.critical, "killed vLLM", "sparkdguardkilled"),
    "planned_restart": (Severity.warning, "restarts vLLM while it is idle", "sparkdmemoryleakpredicted"),
    "refuse_start": (Severity.warning, "refuses to start vLLM", "sparkdguardrefusesstart"),
    "warn": (Severity.warning, "warns", "sparkdmemorylow"),
}


def guard_event(node: str, action: str, reason: str, *, dry_run: bool = False) -> Event | None:
    """The event for one guard decision (``Decision.action.value``, ``Decision.reason``), or None for one nobody
    needs to hear (ok, the cool-down). A dry run's "would" is said as such, one level lower."""
    known = _GUARD.get(action)
    if known is None:
        return None
    severity, did, anchor = known
    if dry_run:
        severity = Severity.warning if severity is Severity.critical else Severity.info
        did = f"would {action} (dry run: [guard] dry_run)"
    return Event(EventKind.guard, severity, node, f"The memory guard on {node} {did}", reason,
                 FailureClass.killed_by_guard.value if action in ("stop", "kill") else None, anchor)
