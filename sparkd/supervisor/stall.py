"""The wedge clock: is vLLM's engine still completing steps? Pure; the health tracker holds one and asks it.

Real vLLM publishes its progress only from engine steps that *complete*: the ``vllm:*`` gauges and counters
and the periodic throughput log line both come from the scheduler stats of a finished step (vLLM 0.13–0.24,
``v1/core/sched/scheduler.py`` ``make_stats``). A wedged step therefore freezes everything at its last value —
gauges at 0 when the wedge began on an idle engine. So the clock reads progress from every source there is and
lets only a request it knows is waiting prove a wedge. Rules:

1. Progress is any of: generated tokens counted, the prompt-token counter or KV cache usage moving while the
   number of requests stays the same (a prefill chunk), a throughput line with tokens moving, a canary answer, a
   JIT-compile line (the worker is alive, compiling). Each sets ``progress_at``. The first scrape is a baseline,
   no progress. A move that only shows requests arriving or leaving — more or fewer of them, their prompt and KV
   counted or released, no token — proves no step: a server that publishes admissions and aborts at once shows
   exactly that while wedged.
2. Work is pending when the gauges (or the latest throughput line) count requests running or waiting, or a
   canary timed out and has not been answered since: ``waiting_since`` is the earlier of when the gauges first
   showed work and when that canary was sent.
3. ``stall`` — requests running and no progress for the busy limit, and a canary timed out in that time (or the
   canary is off): ``max(stall_after_s, 2 × the longest step seen in this busy spell)``, capped at vLLM's execute
   timeout. The adaptive part keeps a 1M-token prefill (steps of 10–50 s) from reading as a stall, the canary
   keeps stale gauges from reading as one: vLLM does not republish them after the last request is aborted.
4. ``hang`` — the engine was idle by every gauge, a canary got no answer within ``canary_timeout_s``, and no
   progress came since it was sent (seen by a scrape after it was sent, or by throughput lines that stayed
   silent): an idle-engine wedge, which frozen gauges at 0 would otherwise hide.
5. A JIT compile holds both verdicts until the next progress or until vLLM's own execute timeout
   (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``) has passed since it: vLLM would let that step run that long, so a pair
   it would survive is not restarted (and restarted again into the same cold compile).
6. Blind: with no ``vllm:*`` metrics and no throughput line ever seen (``--disable-log-stats``) the executor's
   wait line is the one step signal left. With TP ≥ 2 vLLM's EngineCore logs "No available shared memory
   broadcast block found in N seconds" every N s (``VLLM_RINGBUFFER_WARNING_INTERVAL``, 60) while it waits for a
   worker to finish one step; lines at most 1.5 N apart are one wait. Once a wait reaches ``stall_after_s``
   (one line, at vLLM's default) while a canary is unanswered, it is a ``hang``; a canary answered since ends the
   wait. Without those lines (TP = 1: no executor queue) only a canary that stays unanswered for ``busy_grace_s``
   makes a ``hang`` (the tracker's rule). A 1M-token prefill in chunks of up to ~32K tokens takes steps under
   60 s, so it writes no such line; a JIT compile does, and rule 5 holds it.
7. The step probe (issue 38) overrules the blind: while its records show vLLM's ranks stepping within their limits
   (:func:`sparkd.supervisor.stepwatch.progressing`, ``on_probe``), neither the executor's wait line nor the busy
   grace makes a verdict — a 1M-token prefill holds the canary for minutes and is no wedge. Where vLLM's metrics are
   on, the count of ``vllm:iteration_tokens_total`` (one per engine step with outputs) moving is progress too: a
   heartbeat from the API side.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from sparkd.supervisor.servelog import JitCompile, ShmWait, Throughput

if TYPE_CHECKING:
    from sparkd.config import HealthConfig
    from sparkd.supervisor.readings import VllmMetrics

__all__ = ["VLLM_DEFAULT_EXECUTE_TIMEOUT_S", "StallClock", "Wedge", "execute_timeout", "judge"]

# vLLM's default for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (envs.py, 0.13–0.24); sparkd's launch env sets 1800.
VLLM_DEFAULT_EXECUTE_TIMEOUT_S = 300.0
VOUCH_S = 3.0  # how long the step probe's word holds (it reads every second: two readings missed)
STEP_MARGIN = 2.0  # the busy limit is at least this many times the longest step seen in the busy spell
LOG_STATS_INTERVAL_S = 10.0  # VLLM_LOG_STATS_INTERVAL: the throughput line's tokens moved during the last 10 s
WAIT_RUN_SLACK = 1.5  # executor wait lines at most this many intervals apart belong to one wait (rule 6)

_Marks = tuple[float, float | None, float | None, float, float | None]


@dataclass(frozen=True)
class StallClock:
    marks: _Marks | None = None  # the metrics' progress marks at the last scrape
    metrics_at: float | None = None  # the last scrape that had vLLM's metrics
    metrics_off: bool = False  # the last scrape answered, without any vllm:* family
    running: int = 0  # requests running per the latest gauges or throughput lines
    waiting: int = 0
    lines: dict[str, Throughput] = field(default_factory=dict)  # the latest throughput line per engine
    progress_at: float | None = None  # the last progress of any kind (rule 1): when it was seen
    progress_from: float | None = None  # the earliest it can have happened (a scrape sees a step late)
    busy_since: float | None = None  # the gauges first showed work in this busy spell
    longest_step_s: float = 0.0  # the longest gap between progress in this busy spell
    canary_sent_at: float | None = None  # a canary that timed out, unanswered since: when it was sent
    jit_at: float | None = None  # a JIT compile seen since the last progress
    jit_what: str | None = None
    wait_lines: int = 0  # the executor's wait lines of the current wait (rule 6)
    wait_interval_s: int = 0  # the interval they state
    wait_last_at: float | None = None  # when the latest one was read
    steps_total: float | None = None  # vllm:iteration_tokens_total's count at the last scrape (rule 7)
    vouched_at: float | None = None  # the step probe last showed the ranks stepping within their limits (rule 7)

    @property
    def observable(self) -> bool:
        """Some source shows engine steps: vLLM's metrics, or its throughput lines."""
        return self.metrics_at is not None or bool(self.lines)

    @property
    def gauges_busy(self) -> bool:
        return self.running + self.waiting > 0


@dataclass(frozen=True)
class Wedge:
    """A verdict: the class and the "what happened" half of its sentence, with the evidence."""

    cls: Literal["stall", "hang"]
    what: str
    evidence: str


def execute_timeout(cfg: HealthConfig) -> float:
    return cfg.execute_timeout_s if cfg.execute_timeout_s is not None else VLLM_DEFAULT_EXECUTE_TIMEOUT_S


def _progress(c: StallClock, now: float, since: float | None = None) -> StallClock:
    """Progress seen at `now` that happened after `since` (None: at `now`). It ends a JIT hold only when it surely
    came after the JIT line: a throughput line's tokens may predate it by up to an interval, a scrape's change by
    up to the time since the last scrape."""
    after = now if since is None else since
    # A step is the gap between progress within a busy spell; a JIT pause is no step (rule 5 covers it).
    in_step = c.progress_at is not None and c.busy_since is not None and c.jit_at is None
    step = now - c.progress_at if in_step and c.progress_at is not None else 0.0
    answered = c.canary_sent_at is None or after > c.canary_sent_at  # the step surely came after the canary
    c = replace(c, progress_at=now, progress_from=after, longest_step_s=max(c.longest_step_s, step),
                canary_sent_at=None if answered else c.canary_sent_at)
    if c.jit_at is not None and after > c.jit_at:
        c = replace(c, jit_at=None, jit_what=None)
    if c.wait_last_at is not None and after > c.wait_last_at:
        c = replace(c, wait_lines=0, wait_last_at=None)
    return c


def _work(c: StallClock, running: int, waiting: int, now: float) -> StallClock:
    busy = running + waiting > 0
    if not busy:
        return replace(c, running=0, waiting=0, busy_since=None, longest_step_s=0.0)
    return replace(c, running=running, waiting=waiting, busy_since=c.busy_since if c.busy_since is not None else now)


def on_metrics(c: StallClock, metrics: VllmMetrics, now: float) -> StallClock:
    marks: _Marks = (metrics.generation_tokens_total, metrics.prompt_tokens_total, metrics.kv_cache_usage_perc,
                     metrics.num_requests_running, metrics.num_requests_waiting)
    steps = metrics.engine_steps_total
    counted = steps is not None and c.steps_total is not None and steps != c.steps_total  # rule 7's heartbeat
    moved = c.marks is not None and (_stepped(c.marks, marks) or counted)
    previous = c.metrics_at
    c = replace(c, marks=marks, metrics_at=now, metrics_off=False, steps_total=steps)
    if moved:  # never the first scrape (rule 1): dated at it, a step would answer a canary sent just before it
        c = _progress(c, now, previous)
    return _work(c, int(metrics.num_requests_running), int(metrics.num_requests_waiting or 0), now)


def _stepped(before: _Marks, after: _Marks) -> bool:
    """Rule 1 for two scrapes' marks (generation, prompt, KV usage, running, waiting)."""
    if after[0] != before[0]:
        return True
    same_requests = after[3] + (after[4] or 0) == before[3] + (before[4] or 0)
    return same_requests and after[1:3] != before[1:3]


def on_metrics_off(c: StallClock) -> StallClock:
    return replace(c, metrics_off=True, metrics_at=None, marks=None)


def on_line(c: StallClock, seen: Throughput | JitCompile | ShmWait, now: float) -> StallClock:
    if isinstance(seen, JitCompile):
        return replace(c, jit_at=now, jit_what=seen.what)
    if isinstance(seen, ShmWait):
        return _waited(c, seen.interval_s, now)
    lines = {**c.lines, seen.engine: seen}
    c = replace(c, lines=lines)
    if c.metrics_at is not None:
        return c  # the same numbers as the scraped gauges, older and coarser: the scrape decides
    if seen.moving:
        c = _progress(c, now, now - LOG_STATS_INTERVAL_S)
    return _work(c, sum(t.running for t in lines.values()), sum(t.waiting for t in lines.values()), now)


def _waited(c: StallClock, interval_s: int, now: float) -> StallClock:
    same_wait = (c.wait_last_at is not None and interval_s == c.wait_interval_s
                 and now - c.wait_last_at <= WAIT_RUN_SLACK * interval_s)
    return replace(c, wait_lines=c.wait_lines + 1 if same_wait else 1, wait_interval_s=interval_s, wait_last_at=now)


def on_probe(c: StallClock, now: float) -> StallClock:
    """The step probe shows vLLM's ranks stepping within their limits now (rule 7)."""
    return replace(c, vouched_at=now)


def vouched(c: StallClock, now: float) -> bool:
    """The step probe's word that the ranks step within their limits holds now (rule 7)."""
    return c.vouched_at is not None and now - c.vouched_at <= VOUCH_S


def on_canary(c: StallClock, answered: bool, sent_at: float, now: float) -> StallClock:
    if answered:
        return _progress(c, now)
    return replace(c, canary_sent_at=c.canary_sent_at if c.canary_sent_at is not None else sent_at)


def held(c: StallClock, now: float, cfg: HealthConfig) -> bool:
    return c.jit_at is not None and now - c.jit_at < execute_timeout(cfg)


def busy_limit(c: StallClock, cfg: HealthConfig) -> float:
    return min(max(cfg.stall_after_s, STEP_MARGIN * c.longest_step_s), execute_timeout(cfg))


def judge(c: StallClock, now: float, cfg: HealthConfig, *, clients: int | None = None) -> Wedge | None:
    """The wedge the evidence proves at `now`, if any (rules 3–6; rule 6's busy grace is the tracker's). `clients`:
    other clients' connections open on vLLM's API port (None: not seen), which tell an idle wedge from one with
    requests in flight that the frozen gauges do not show."""
    if held(c, now, cfg):
        return None
    if not c.observable:
        return _blind(c, now, cfg)
    canary_out = c.canary_sent_at is not None
    if c.gauges_busy and c.busy_since is not None and (canary_out or not cfg.canary):
        since = max(c.busy_since, c.progress_at if c.progress_at is not None else c.busy_since)
        limit = busy_limit(c, cfg)
        if now - since >= limit:
            return _stall(c, now - since, limit)
    if not c.gauges_busy and c.canary_sent_at is not None:
        sent = c.canary_sent_at
        # only a step surely after the canary was sent answers it: a scrape sees a step up to an interval late
        no_step_since = c.progress_from is None or c.progress_from <= sent
        if no_step_since and _watched_since(c, sent) and now - sent >= cfg.canary_timeout_s:
            return _idle_hang(c, now - sent, clients)
    return None


def _blind(c: StallClock, now: float, cfg: HealthConfig) -> Wedge | None:
    """Rule 6: only the executor's wait lines show a step that does not complete (unless rule 7 overrules it)."""
    if c.wait_last_at is None or (cfg.canary and c.canary_sent_at is None) or vouched(c, now):
        return None
    if now - c.wait_last_at > WAIT_RUN_SLACK * c.wait_interval_s:
        return None  # no line since: that step completed
    waited = c.wait_lines * c.wait_interval_s
    if waited < cfg.stall_after_s:
        return None
    lines = f"{c.wait_lines} line{'s' if c.wait_lines != 1 else ''}"
    return Wedge("hang",
                 f"vLLM's executor has waited {waited} s for a worker to finish one engine step (\"No available "
                 f"shared memory broadcast block found in {c.wait_interval_s} seconds\", {lines}), a test generation "
                 f"got no answer and no JIT compile within vLLM's execute timeout explains it",
                 f"{lines} of the executor's wait, {c.wait_interval_s} s each (limit {cfg.stall_after_s:g} s); "
                 f"canary unanswered; vLLM's metrics and throughput log are off (--disable-log-stats)")


def _watched_since(c: StallClock, sent: float) -> bool:
    """Was the engine watched while the canary waited: a scrape after it was sent, or throughput lines (which vLLM
    writes whenever tokens move, so their silence is evidence too)?"""
    if c.metrics_at is not None:
        return c.metrics_at > sent
    return bool(c.lines)


def _frozen(c: StallClock) -> str:
    if c.marks is None:
        return "vLLM's throughput log shows no token moving"
    generation, _, kv, _, _ = c.marks
    kv_note = f", KV cache usage unchanged at {kv:.1%}" if kv is not None else ""
    return f"generation_tokens_total stuck at {generation:.0f}{kv_note}"


def _stall(c: StallClock, quiet: float, limit: float) -> Wedge:
    n = c.running
    requests = f"{n} request{'s' if n != 1 else ''} running" + (f", {c.waiting} waiting" if c.waiting else "")
    return Wedge("stall",
                 f"{requests} and no engine step completed for {quiet:.0f} s ({_frozen(c)}; stall limit "
                 f"{limit:.0f} s) and a test generation got no answer",
                 f"vllm:num_requests_running={c.running} vllm:num_requests_waiting={c.waiting}; no progress for "
                 f"{quiet:.0f} s (limit {limit:.0f} s, longest step this busy spell {c.longest_step_s:.0f} s); "
                 f"{_frozen(c)}")


def in_flight(clients: int | None) -> str:
    """How a wedge sentence ends: with the requests that wait on it, idle, or (unseen) neither."""
    if clients is None:
        return ""
    if clients == 0:
        return " while idle (no client connection open on the API port)"
    plural = "s" if clients != 1 else ""
    return f" with requests in flight ({clients} client connection{plural} waiting on the API port)"


def _idle_hang(c: StallClock, waited: float, clients: int | None) -> Wedge:
    gauges = ("its gauges stayed at 0 running, 0 waiting: they move only when a step completes"
              if c.metrics_at is not None else "its throughput log stayed silent")
    return Wedge("hang",
                 f"the generation canary has had no answer for {waited:.0f} s and vLLM completed no engine step since "
                 f"it was sent ({gauges}): the engine is wedged{in_flight(clients)}",
                 f"canary unanswered for {waited:.0f} s; vllm:num_requests_running=0 vllm:num_requests_waiting=0; "
                 f"{_frozen(c)}; client connections on the API port: {'not seen' if clients is None else clients}")
