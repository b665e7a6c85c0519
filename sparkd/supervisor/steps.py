"""The step probe's verdicts (issue 38): which vLLM process is stuck, from every rank's last step record. Pure.

The shell reads each node's step files (:mod:`sparkd.host.stepfiles`) — a group's head gets the workers' readings
over the peer link — and hands them here with its own monotonic ``now``; a reading carries the monotonic time of
its own node, so every duration is taken on the clock that stamped it and only its age crosses nodes. Records of
processes that are gone are the shell's to drop. Rules, the first that holds wins:

1. **A rank behind the others** (a worker rank of a tensor-parallel group): it is inside step S while another rank
   has finished S, for longer than S's limit (:func:`sparkd.supervisor.stephistory.limit_s`: the identity's own
   step times, a floor of a few seconds); or it is idle after step S-1 while another rank began S (or a later
   step) at least the floor ago (an idle rank takes a broadcast step at once). Of several such ranks the one the
   kernel stopped is named, else the one furthest behind. ``hang``: "rank 1 (worker) on b,
   PID 7 has been inside step 48213 for 42 s (limit 5 s); rank 0 (worker) finished it and waits (idle for 42 s)".
2. **Every rank inside one step** past its limit, none finished: with several ranks, a collective that does not
   complete (``hang``); with one, a step that does not (``stall``: it holds requests). Claimed only when every
   rank of the world has a record.
3. **The engine core stuck in its own step**: inside a step for the floor while no worker of its node is inside one
   (they returned from what it gave them, or never got it) — ``hang``, naming the engine core (or the worker, when
   that process is stopped or in the kernel's uninterruptible sleep). On a GPU a rank returns before the kernels it
   queued finish, so a collective that never completes shows this way too: the sentence says so.
4. **An engine that stopped scheduling**: idle, no step begun for ``schedule_s`` although it ended its last step
   still holding requests, or although a request is known to wait (``pending``: a test generation unanswered, the
   shell's evidence) since before its last step began — ``stall``.

Each verdict names the process (rank, node, PID), the step and for how long; :meth:`StepVerdict.failure` makes the
`Failure` the lifecycle and the classifier take (a hint: the first cause wins). ``hold`` (a JIT compile vLLM itself
would wait out, as the wedge clock's rule 5) keeps every rule quiet. A process whose probe turned itself off says
so in its record; it counts as no record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.stephistory import StepHistory, StepLimits, limit_s
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

__all__ = ["NodeSteps", "Pending", "RankView", "StepVerdict", "judge_steps", "probe_off", "records_text", "views"]

_STOPPED = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer", "D": "in uninterruptible sleep (the kernel or a "
            "driver holds it)"}
_PHASE_NOTE = {"collective": " (in a collective)"}
_DO_HANG = "the tensor-parallel group is wedged on that process — sparkd restarts every rank"
_DO_STALL = "vLLM makes no progress on the requests it holds — sparkd restarts vLLM"
_DO_HANG_ONE = "vLLM's one engine is wedged on that process — sparkd restarts vLLM"  # no tensor-parallel group


@dataclass(frozen=True)
class NodeSteps:
    """One node's step files at one reading: ``read_at_ns`` on that node's monotonic clock (the clock of its
    records), ``received_at`` on the judge's (when the reading was taken, or arrived over the peer link)."""

    node: str
    read_at_ns: int
    records: tuple[StepRecord, ...]
    received_at: float
    states: Mapping[tuple[str, int], str] = field(default_factory=dict)  # (role, rank) → /proc state letter


@dataclass(frozen=True)
class Pending:
    """A request the shell knows waits on the engine: since when (the judge's clock), and what it is."""

    since: float
    what: str


@dataclass(frozen=True)
class RankView:
    """One record as the judge sees it at ``now``."""

    node: str
    record: StepRecord
    inside_s: float  # since the current (or last) step began; inf before the first
    idle_s: float  # since the last step ended; inf before the first
    began_at: float  # when the current (or last) step began, on the judge's clock (-inf before the first)
    state: str | None  # the process's state letter, when the shell read it

    @property
    def name(self) -> str:
        r = self.record
        return f"rank {r.rank} (worker)" if r.role == "worker" else f"the engine core (engine {r.rank})"

    @property
    def who(self) -> str:
        stopped = f", {_STOPPED[self.state]}" if self.state in _STOPPED else ""
        return f"{self.name} on {self.node}, PID {self.record.pid}{stopped}"


@dataclass(frozen=True)
class StepVerdict:
    cls: FailureClass
    what: str  # the sentence's first half
    do: str
    view: RankView  # the process it names
    step: int
    seconds: float
    evidence: str  # every rank's last record

    def failure(self) -> Failure:
        return Failure.of(self.cls, f"{self.what}; {self.do}.", evidence=self.evidence)


def _seconds(ns: int) -> float:
    return ns / 1e9


def views(nodes: Sequence[NodeSteps], now: float) -> list[RankView]:
    out = []
    for reading in nodes:
        age = max(0.0, now - reading.received_at)
        for r in reading.records:
            inside = _seconds(reading.read_at_ns - r.began_ns) + age if r.began_ns else math.inf
            idle = _seconds(reading.read_at_ns - r.ended_ns) + age if r.ended_ns else math.inf
            out.append(RankView(reading.node, r, inside, idle, now - inside if r.began_ns else -math.inf,
                                reading.states.get((r.role, r.rank))))
    return sorted(out, key=lambda v: (v.record.role != "engine", v.record.rank, v.node))


def records_text(seen: Sequence[RankView]) -> str:
    """Every process's last record, one clause each: the incident's evidence."""
    clauses = []
    for v in seen:
        r = v.record
        if r.phase == "off":
            now = f"probe off ({r.note})"
        elif r.in_step:
            tokens = f", {r.tokens} tokens" if r.tokens >= 0 else ""
            now = f"inside step {r.step} for {v.inside_s:.1f} s{tokens}" + _PHASE_NOTE.get(r.phase, "")
        else:
            ended = f", ended {v.idle_s:.1f} s ago" if r.ended_ns else ""
            held = f", holding {r.held} requests" if r.held > 0 else ""
            now = f"idle after step {r.step}{ended}{held}"
        clauses.append(f"{v.who}: {now}; longest step {_seconds(r.longest_ns):.3g} s")
    return "; ".join(clauses) if clauses else "no step records"


def probe_off(nodes: Sequence[NodeSteps]) -> list[str]:
    """A sentence for each process whose probe turned itself off (status shows them as a warning)."""
    return [f"{r.role} {r.rank} on {n.node} (PID {r.pid}): {r.note or 'off'}" for n in nodes for r in n.records
            if r.phase == "off"]


def judge_steps(nodes: Sequence[NodeSteps], history: StepHistory, now: float, limits: StepLimits, *,
                pending: Pending | None = None, hold: str | None = None) -> StepVerdict | None:
    """The verdict every rank's records prove at ``now``, if any (the rules of the module's doc, in order)."""
    if hold is not None:
        return None
    seen = [v for v in views(nodes, now) if v.record.phase != "off"]
    evidence = records_text(views(nodes, now))
    workers = [v for v in seen if v.record.role == "worker"]
    engines = [v for v in seen if v.record.role == "engine"]
    return (_behind(workers, history, limits, evidence) or _all_inside(workers, history, limits, evidence)
            or _engine_stuck(engines, workers, limits, evidence)
            or _not_scheduling(engines, pending, now, limits, evidence))


def _limit(v: RankView, history: StepHistory, limits: StepLimits) -> float:
    return limit_s(history, v.record.tokens, limits)


def _behind(workers: list[RankView], history: StepHistory, limits: StepLimits, evidence: str) -> StepVerdict | None:
    """Rule 1: a rank still inside (or not yet in) a step another rank is past. Of several, the one the kernel
    stopped, else the one furthest behind (the fewest steps begun): the others wait on it."""
    found = []
    for v in workers:
        r = v.record
        if r.in_step:
            done = [w for w in workers if w is not v and w.record.done >= r.step]
            limit = _limit(v, history, limits)
            if done and v.inside_s >= limit:
                other = done[0]
                found.append(StepVerdict(
                    FailureClass.hang, f"{v.who} has been inside step {r.step} for {v.inside_s:.0f} s (limit "
                    f"{limit:.0f} s); {other.name} finished it and {_waits(other)}", _DO_HANG, v, r.step, v.inside_s,
                    evidence))
        else:
            verdict = _not_begun(v, workers, limits, evidence)
            if verdict is not None:
                found.append(verdict)
    return min(found, key=lambda f: (f.view.state not in _STOPPED, f.view.record.step), default=None)


def _not_begun(v: RankView, workers: list[RankView], limits: StepLimits, evidence: str) -> StepVerdict | None:
    """An idle rank that has not taken the step after its last one, which another rank began at least the floor
    ago (a rank that began a later step began that one no later)."""
    step = v.record.step + 1
    ahead = [w for w in workers if w.record.step >= step]
    if not ahead:
        return None
    other = max(ahead, key=lambda w: w.inside_s)
    if other.inside_s < limits.floor_s:
        return None
    if other.record.in_step and other.record.step == step:
        done = f"which {other.name} began {other.inside_s:.0f} s ago and waits in"
    else:
        done = f"which {other.name} is past (it began step {other.record.step} {other.inside_s:.0f} s ago)"
    return StepVerdict(FailureClass.hang, f"{v.who} has not begun step {step}, {done} (limit {limits.floor_s:.0f} s)",
                       _DO_HANG, v, step, other.inside_s, evidence)


def _waits(v: RankView) -> str:
    r = v.record
    if r.in_step:
        where = "in a collective of" if r.phase == "collective" else "inside"
        return f"has waited {where} step {r.step} for {v.inside_s:.0f} s"
    return f"waits (idle for {v.idle_s:.0f} s)"


def _all_inside(workers: list[RankView], history: StepHistory, limits: StepLimits,
                evidence: str) -> StepVerdict | None:
    """Rule 2: every rank of the world inside the same step, past its limit."""
    if not workers or not all(v.record.in_step for v in workers):
        return None
    world = max(v.record.world_size for v in workers)
    if len({v.record.step for v in workers}) != 1 or len({v.record.rank for v in workers}) < world:
        return None
    soonest = min(v.inside_s for v in workers)
    limit = max(_limit(v, history, limits) for v in workers)
    if soonest < limit:
        return None
    # name a stopped process first: it is why the others wait
    first = min(workers, key=lambda v: (v.state not in ("T", "t", "D"), v.inside_s))
    step = first.record.step
    if world == 1:
        return StepVerdict(FailureClass.stall, f"{first.who}, the only rank, has been inside step {step} for "
                           f"{first.inside_s:.0f} s (limit {limit:.0f} s) and has not finished it", _DO_STALL, first,
                           step, first.inside_s, evidence)
    ranks = ", ".join(f"{v.name} PID {v.record.pid} on {v.node}" for v in workers)
    what = (f"every rank has been inside step {step} for at least {soonest:.0f} s (limit {limit:.0f} s) and none "
            f"finished it ({ranks}): a collective that does not complete")
    if first.state in _STOPPED:
        what = f"{first.who} inside step {step}; " + what
    return StepVerdict(FailureClass.hang, what, _DO_HANG, first, step, soonest, evidence)


def _engine_stuck(engines: list[RankView], workers: list[RankView], limits: StepLimits,
                  evidence: str) -> StepVerdict | None:
    """Rule 3: the engine core inside its step while none of its node's workers is inside one."""
    for e in engines:
        local = [w for w in workers if w.node == e.node]
        if not e.record.in_step or e.inside_s < limits.floor_s or any(w.record.in_step for w in local):
            continue
        took = [w for w in local if w.began_at >= e.began_at]
        stopped = [w for w in local if w.state in ("T", "t", "D")]
        culprit = stopped[0] if stopped else e
        if took:
            what = (f"{e.who} has been inside step {e.record.step} for {e.inside_s:.0f} s (limit "
                    f"{limits.floor_s:.0f} s) although its workers returned from their part of it and wait: the "
                    "engine core is stuck, or the GPU work its ranks queued does not complete")
        else:
            names = ", ".join(f"{w.name} PID {w.record.pid} idle {w.idle_s:.0f} s" for w in local) or "none here"
            what = (f"{e.who} has been inside step {e.record.step} for {e.inside_s:.0f} s (limit "
                    f"{limits.floor_s:.0f} s) and no worker began a step since ({names})")
            if culprit is not e:
                what = f"{culprit.who} takes no step: " + what
        do = _DO_HANG if e.record.world_size > 1 else _DO_HANG_ONE
        return StepVerdict(FailureClass.hang, what, do, culprit, e.record.step, e.inside_s, evidence)
    return None


def _not_scheduling(engines: list[RankView], pending: Pending | None, now: float, limits: StepLimits,
                    evidence: str) -> StepVerdict | None:
    """Rule 4: an idle engine core that begins no step although requests wait."""
    for e in engines:
        r = e.record
        if r.in_step:
            continue
        if r.held > 0 and r.ended_ns and e.idle_s >= limits.schedule_s:
            what = (f"{e.who} ended step {r.step} still holding {r.held} request{'s' if r.held != 1 else ''} and has "
                    f"begun no step for {e.idle_s:.0f} s (limit {limits.schedule_s:.0f} s): it stopped scheduling")
            return StepVerdict(FailureClass.stall, what, _DO_STALL, e, r.step + 1, e.idle_s, evidence)
        if pending is not None and e.began_at < pending.since and now - pending.since >= limits.schedule_s:
            waited = now - pending.since
            what = (f"{pending.what}, and {e.who} has begun no step for {waited:.0f} s since (limit "
                    f"{limits.schedule_s:.0f} s; idle after step {r.step}): it stopped scheduling")
            return StepVerdict(FailureClass.stall, what, _DO_STALL, e, r.step + 1, waited, evidence)
    return None
