"""Health verdicts from probe results: when vLLM counts as ready, degraded, recovered or failed. Pure.

The I/O side (:mod:`sparkd.daemon.watch.probes`) turns one HTTP request into a `ProbeResult` or `VllmMetrics`; the
`observe_*` functions fold one of them, with the monotonic `now` it arrived at, into a `HealthTracker` and
return at most one machine observation, only when the verdict changes (kubelet's prober results + thresholds).

Rules:

1. Before the first `/health` 200 the tracker is `starting`: vLLM's port does not listen until "Application
   startup complete.", so refusals, timeouts and errors are expected and ignored (the machine's startup
   budget covers a start that never finishes). A 503 still counts: it means the server is up and the engine
   dead. The first 200 emits `BecameReady`.
2. `/health` failures are 503 (`engine_dead`), `refused` and `timeout`. `failure_threshold` in a row emit
   `HealthFailed`: `engine_dead` if the streak holds a 503 or ends refused (the API server is gone), else
   `hang`. Fewer in a row degrade, with the count in the reason.
3. A probe `error` (another status, a reset, a malformed answer) means "could not probe", not "unhealthy":
   it neither adds to nor breaks a failure streak, it degrades, and it never fails the instance on its own.
4. `success_threshold` 200s in a row clear what `/health` degraded; when nothing else degrades,
   `HealthRecovered`.
5. Canary: a timeout while the latest `/health` is 200 means busy: degraded. A canary 200 clears busy.
   `engine_dead` fails at once. Canary refusals and timeouts while `/health` is not 200 are left to the `/health`
   layer. Whether a busy engine is wedged is the wedge clock's question (rule 6); when no engine step is
   observable (no `vllm:*` metrics, no throughput lines) and the executor logs no wait either (TP = 1), busy
   becomes a `hang` after `busy_grace_s`.
6. Wedges: every metrics scrape, canary result and serving log line (`observe_log_line`: throughput, the
   executor's wait, a JIT compile) feeds the wedge clock (:mod:`sparkd.supervisor.stall`), which calls a `stall`
   (requests running, no engine step for the busy limit, a canary unanswered) or a `hang` (an idle engine that
   completes no step for a canary), and holds both while a JIT compile may still run within vLLM's execute
   timeout.
7. A `/metrics` page without any `vllm:*` family (vLLM runs with `--disable-log-stats`) sets `watch_note`; it
   does not degrade the instance (vLLM serves fine), it says the wedge clock sees only the executor's wait lines.
8. After `HealthFailed` the tracker is on hold: it only counts. Start a fresh tracker for the next instance.
9. The step probe (issue 38, :mod:`sparkd.supervisor.stepwatch`) folds in through `observe_probe`: its verdict fails
   the instance like any other (the first verdict wins), and its word that the ranks step within their limits
   overrules the blind rules (the busy grace of rule 5, the executor's wait line: the wedge clock's rule 7).

A degraded reason that changes (2 of 3 failures instead of 1 of 3, busy instead of an error) is emitted again
as `HealthDegraded`; the machine keeps it as its health note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from sparkd.supervisor import stall
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.readings import MetricsOff, ProbeName, ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.servelog import read_serve_line
from sparkd.supervisor.stall import StallClock
from sparkd.supervisor.vocabulary import BecameReady, HealthDegraded, HealthFailed, HealthRecovered, Observation

if TYPE_CHECKING:
    from sparkd.config import HealthConfig

__all__ = [
    "HealthTracker",
    "MetricsOff",
    "ProbeName",
    "ProbeOutcome",
    "ProbeResult",
    "Topology",
    "Verdict",
    "VllmMetrics",
    "clients_due",
    "observe_canary",
    "observe_clients",
    "observe_health",
    "observe_log_line",
    "observe_metrics",
    "observe_probe",
    "topology_of",
]

class Topology(StrEnum):
    """What a wedge can be in: the hang sentence names the parts this instance has, and only those."""

    single = "single"  # one node, one GPU (or vLLM's CPU build): no NCCL, no peer
    local = "local"  # one node, several GPUs: NCCL between them, no peer node
    group = "group"  # ranks on several nodes: NCCL over the interconnect, a peer node


def topology_of(nnodes: int, tensor_parallel: int | None, pipeline_parallel: int | None) -> Topology:
    """What a wedge of an instance can be in: a peer node, NCCL between this node's GPUs, or one engine."""
    if nnodes > 1:
        return Topology.group
    return Topology.local if (tensor_parallel or 1) * (pipeline_parallel or 1) > 1 else Topology.single


class Verdict(StrEnum):
    starting = "starting"  # no /health 200 yet
    healthy = "healthy"
    degraded = "degraded"
    failed = "failed"  # HealthFailed was emitted; on hold


@dataclass(frozen=True)
class HealthTracker:
    verdict: Verdict = Verdict.starting
    note: str | None = None  # the degraded reason last emitted
    failure: Failure | None = None  # what HealthFailed reported
    last_health: ProbeOutcome | None = None  # the latest /health outcome
    consecutive_failures: int = 0  # /health failures in a row; errors neither add nor reset
    failure_streak: tuple[ProbeOutcome, ...] = ()  # the last failure_threshold of them, oldest first
    consecutive_errors: int = 0  # /health probe errors in a row
    consecutive_successes: int = 0  # /health 200s in a row
    health_note: str | None = None  # why /health degrades; cleared by success_threshold 200s
    canary_note: str | None = None  # why the canary degrades (busy, or a probe error); cleared by a 200
    busy_since: float | None = None  # the first canary timeout of the current busy spell
    clock: StallClock = field(default_factory=StallClock)  # is the engine still completing steps?
    watch_note: str | None = None  # what the wedge clock cannot see (vLLM's metrics are off)
    probes_total: Mapping[tuple[ProbeName, str], int] = field(default_factory=dict)  # by (probe, outcome)
    last_latency_s: Mapping[ProbeName, float] = field(default_factory=dict)
    topology: Topology = Topology.group  # what the instance is made of (the shell knows it from the config)
    clients: int | None = None  # other clients' connections open on vLLM's API port (None: cannot be seen)
    signals: Mapping[str, object] = field(default_factory=dict)  # a signal rule's own state, by its name

    def errors_total(self, probe: ProbeName) -> int:
        """Probe errors (could not probe), counted apart from failures."""
        return self.probes_total.get((probe, ProbeOutcome.error.value), 0)

    @property
    def watching(self) -> bool:
        """Past the first /health 200 and not failed: the canary and the stall check apply."""
        return self.verdict in (Verdict.healthy, Verdict.degraded)


Step = tuple[HealthTracker, Observation | None]

_RESTART = "sparkd restarts vLLM with backoff"
_SEE_LOG = f"{_RESTART}; the log tail in the incident folder shows what led to it"
_WEDGED = {
    Topology.group: f"the tensor-parallel pair is likely wedged (NCCL or the peer) — {_RESTART}",
    Topology.local: f"its tensor-parallel workers are likely wedged (NCCL between this node's GPUs, or one stuck "
                    f"worker) — {_RESTART}",
    Topology.single: f"one engine, no peer and no NCCL: its engine core process is stuck or stopped — {_RESTART}",
}


def _count(t: HealthTracker, probe: ProbeName, outcome: str, latency_s: float | None = None) -> HealthTracker:
    totals = dict(t.probes_total)
    totals[probe, outcome] = totals.get((probe, outcome), 0) + 1
    latency = dict(t.last_latency_s)
    if latency_s is not None:
        latency[probe] = latency_s
    return replace(t, probes_total=totals, last_latency_s=latency)


def _settle(t: HealthTracker) -> Step:
    """Emit the verdict the notes call for, if it differs from the one last emitted."""
    if not t.watching:
        return t, None
    note = t.health_note or t.canary_note
    if note is None:
        if t.verdict is Verdict.degraded:
            return replace(t, verdict=Verdict.healthy, note=None), HealthRecovered()
        return t, None
    if t.verdict is Verdict.healthy or note != t.note:
        return replace(t, verdict=Verdict.degraded, note=note), HealthDegraded(note)
    return t, None


def _fail(t: HealthTracker, cls: FailureClass, what: str, do: str, evidence: str) -> Step:
    failure = Failure(cls=cls, sentence=f"{what}; {do}.", exit_code=None, signal=None, evidence=evidence)
    return replace(t, verdict=Verdict.failed, note=None, failure=failure), HealthFailed(failure)


def _said(outcome: ProbeOutcome, cfg: HealthConfig) -> str:
    return {
        ProbeOutcome.engine_dead: "answered 503",
        ProbeOutcome.refused: "was refused",
        ProbeOutcome.timeout: f"got no answer within {cfg.timeout_s:g} s",
    }.get(outcome, str(outcome))


def observe_health(t: HealthTracker, result: ProbeResult, now: float, cfg: HealthConfig) -> Step:
    """Fold one `/health` result, arrived at monotonic `now` (the thresholds count results, not time)."""
    t = _count(t, "health", result.outcome.value, result.latency_s)
    outcome = result.outcome
    if t.verdict is Verdict.failed:
        return t, None  # on hold until a fresh tracker
    t = replace(t, last_health=outcome)
    if outcome is ProbeOutcome.ok:
        t = replace(t, consecutive_failures=0, failure_streak=(), consecutive_errors=0,
                    consecutive_successes=t.consecutive_successes + 1)
        if t.verdict is Verdict.starting:
            return replace(t, verdict=Verdict.healthy, health_note=None), BecameReady()
        if t.consecutive_successes >= cfg.success_threshold:
            t = replace(t, health_note=None)
        return _settle(t)
    if outcome is ProbeOutcome.error:  # could not probe: degrade, but do not touch the failure streak
        if not t.watching:
            return t, None
        note = t.health_note if t.consecutive_failures else f"/health probe error: {result.detail}"
        return _settle(replace(t, consecutive_errors=t.consecutive_errors + 1, consecutive_successes=0,
                               health_note=note))
    if t.verdict is Verdict.starting and outcome is not ProbeOutcome.engine_dead:
        return t, None  # still starting: the port is not up yet
    n = t.consecutive_failures + 1
    streak = (*t.failure_streak, outcome)[-cfg.failure_threshold:]
    t = replace(t, consecutive_failures=n, failure_streak=streak, consecutive_errors=0,
                consecutive_successes=0)
    if n >= cfg.failure_threshold:
        return _health_failed(t, result, cfg)
    note = f"/health {_said(outcome, cfg)} ({n} of {cfg.failure_threshold} failures in a row)"
    return _settle(replace(t, health_note=note))


def _health_failed(t: HealthTracker, result: ProbeResult, cfg: HealthConfig) -> Step:
    streak = t.failure_streak
    n = t.consecutive_failures
    evidence = f"/health results: {', '.join(streak)}; last: {result.detail or result.outcome}"
    if ProbeOutcome.engine_dead in streak:
        what = f"/health answered 503 ({n} failures in a row): the engine core is dead (EngineDeadError)"
        return _fail(t, FailureClass.engine_dead, what, _SEE_LOG, evidence)
    if streak[-1] is ProbeOutcome.refused:
        what = f"/health was refused {n} times in a row: the API server is gone or no longer listening"
        return _fail(t, FailureClass.engine_dead, what, _SEE_LOG, evidence)
    what = f"/health got no answer within {cfg.timeout_s:g} s, {n} times in a row: the API server hangs"
    return _fail(t, FailureClass.hang, what, _WEDGED[t.topology], evidence)


def observe_canary(t: HealthTracker, result: ProbeResult, now: float, cfg: HealthConfig) -> Step:
    """Fold one generation canary result, arrived at monotonic `now` (sent `result.latency_s` before)."""
    t = _count(t, "canary", result.outcome.value, result.latency_s)
    if not t.watching:
        return t, None
    outcome = result.outcome
    if outcome is ProbeOutcome.ok:
        clock = stall.on_canary(t.clock, True, now - result.latency_s, now)
        return _settle(replace(t, busy_since=None, canary_note=None, clock=clock))
    if outcome is ProbeOutcome.engine_dead:
        what = 'a test generation failed with "EngineCore encountered an issue": the engine core is dead'
        return _fail(t, FailureClass.engine_dead, what, _SEE_LOG, f"canary: {result.detail}")
    if outcome is ProbeOutcome.error:
        return _settle(replace(t, canary_note=f"canary error: {result.detail}"))
    if outcome is ProbeOutcome.refused or t.last_health is not ProbeOutcome.ok:
        return t, None  # /health is not 200: its own failure streak decides
    since = now if t.busy_since is None else t.busy_since
    t = replace(t, busy_since=since, clock=stall.on_canary(t.clock, False, now - result.latency_s, now))
    if not t.clock.observable and not stall.held(t.clock, now, cfg) and not stall.vouched(t.clock, now) \
            and now - since >= cfg.busy_grace_s:
        return _fail(t, FailureClass.hang,
                     f"the generation canary has had no answer for {now - since:.0f} s while /health is 200 "
                     f"(busy grace {cfg.busy_grace_s:g} s): the engine is wedged{_in_flight(t)}", _WEDGED[t.topology],
                     f"canary: {result.detail}; busy since {since:.1f}, now {now:.1f} (monotonic s)")
    step = _judge(t, now, cfg)
    if step[1] is not None:
        return step
    after = ("a wedge if no engine step completes meanwhile" if t.clock.observable
             else f"a hang if vLLM's executor waits {cfg.stall_after_s:g} s on one step, or if still busy after "
                  f"{cfg.busy_grace_s:g} s")
    if stall.held(t.clock, now, cfg):  # say why no verdict comes: the compile vLLM itself would wait out
        after = (f"a JIT compile is running ({t.clock.jit_what}): no wedge is called before vLLM's execute timeout "
                 f"({stall.execute_timeout(cfg):g} s) unless an engine step completes first")
    note = (f"busy: the generation canary got no answer within {cfg.canary_timeout_s:g} s while /health is "
            f"200; {after}")
    return _settle(replace(t, canary_note=note))


def observe_metrics(t: HealthTracker, metrics: VllmMetrics | MetricsOff | None, now: float,
                    cfg: HealthConfig) -> Step:
    """Fold one scrape of vLLM's /metrics taken at monotonic `now`: the series, `MetricsOff` (the page has no
    `vllm:*` family), or None (the scrape failed; the wedge clock keeps what it knew)."""
    t = _count(t, "metrics", ProbeOutcome.error.value if metrics is None else ProbeOutcome.ok.value)
    if isinstance(metrics, MetricsOff):
        t = replace(t, clock=stall.on_metrics_off(t.clock), watch_note=_METRICS_OFF)
    elif metrics is not None:
        t = replace(t, clock=stall.on_metrics(t.clock, metrics, now), watch_note=None)
    return _judge(t, now, cfg)


def observe_log_line(t: HealthTracker, line: str, now: float, cfg: HealthConfig) -> Step:
    """Fold one raw vLLM log line read at monotonic `now`: throughput, wait and JIT lines feed the wedge clock once
    vLLM serves (a startup's compiles are the startup's); every other line changes nothing (the same tracker comes
    back)."""
    seen = read_serve_line(line) if t.watching else None
    if seen is None:
        return t, None
    return _judge(replace(t, clock=stall.on_line(t.clock, seen, now)), now, cfg)


_METRICS_OFF = ("vLLM serves no vllm:* metrics (it runs with --disable-log-stats, which also silences its throughput "
                "log): sparkd sees engine steps only in the executor's wait lines (TP >= 2, every 60 s of one step), "
                "else a wedge is only caught by the canary after busy_grace_s")


def _judge(t: HealthTracker, now: float, cfg: HealthConfig) -> Step:
    if not t.watching:
        return t, None
    health = "200" if t.last_health is ProbeOutcome.ok else f"{t.last_health or 'not probed'}"
    wedge = stall.judge(t.clock, now, cfg, clients=t.clients)
    if wedge is None:
        return t, None
    return _fail(t, FailureClass(wedge.cls), f"{wedge.what} while /health is {health}", _WEDGED[t.topology],
                 wedge.evidence)


def observe_probe(t: HealthTracker, failure: Failure | None, stepping: bool, now: float, *,
                  wedged_for_s: float | None = None) -> Step:
    """Fold the step probe's reading at monotonic `now` (rule 9): its verdict's failure (a wedge of `wedged_for_s`),
    or whether it shows the ranks stepping within their limits."""
    if not t.watching:
        return t, None
    if failure is not None:
        failed = HealthFailed(failure, wedged_for_s=wedged_for_s)
        return replace(t, verdict=Verdict.failed, note=None, failure=failure), failed
    return (replace(t, clock=stall.on_probe(t.clock, now)) if stepping else t), None


CLIENTS_AT_REST_S = 30.0  # at rest, other clients' connections are counted this often (else every health round)
CANARY_SLOW_S = 2.0  # sparkd's canary unanswered this long: a wedge may be named soon, count every round


def clients_due(t: HealthTracker, now: float, counted_at: float | None, canary_sent: float | None) -> bool:
    """Whether the health round counts other clients' connections now. The count words a wedge's sentence (requests
    in flight or idle) and the replay's idle check; each count walks the kernel's whole table of established
    connections, whatever its filter (3.4 ms of kernel time a dump on one quiet 16-core host: up to a fifth of a
    resting daemon's CPU, counted at every round). So: every round while a wedge could be named (sparkd's canary
    slow or unanswered, requests running or waiting), and while the last count saw clients (the replay waits on
    their leaving: a count kept 30 s would hold it off that long), else every :data:`CLIENTS_AT_REST_S`."""
    if counted_at is None or now - counted_at >= CLIENTS_AT_REST_S or t.clients:
        return True
    if canary_sent is not None and now - canary_sent >= CANARY_SLOW_S:
        return True
    return t.clock.canary_sent_at is not None or t.clock.gauges_busy


def observe_clients(t: HealthTracker, clients: int | None) -> HealthTracker:
    """Other clients' connections open on vLLM's API port now (None: the shell cannot see them): a wedge with
    requests in flight is told from an idle one by them, since vLLM's gauges freeze with the engine."""
    return t if t.clients == clients else replace(t, clients=clients)


def _in_flight(t: HealthTracker) -> str:
    return stall.in_flight(t.clients)
