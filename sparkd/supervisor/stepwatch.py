"""The step probe in the health watch (issue 38): how every rank's step records join the instance's health. Pure.

The shell reads every node's step files once a second while vLLM serves (``sparkd.daemon.watch.steps``: this node's
files, a head its workers' readings over the peer link) and folds them here with :func:`observe_steps`, beside the
health tracker (:mod:`sparkd.supervisor.health`) that the other signals feed:

1. **Verdicts** are the step rules' (:func:`sparkd.supervisor.steps.judge_steps`), judged against the identity's own
   step history and with the tracker's facts: a JIT compile the wedge clock holds for holds them too, and a canary of
   sparkd's still unanswered is the request that waits (an engine that begins no step for it stopped scheduling).
   A verdict fails the instance through the tracker (``health.observe_probe``): the first verdict of any signal wins,
   and the classifier's rules (the log's first cause) still judge it as a probe's wedge.
2. **Overruling the blind**: while the records show the ranks stepping within limits the history backs
   (:func:`progressing`), the wedge clock's blind rules make no verdict (``stall`` rule 7): a 1M-token prefill that
   holds the canary for minutes writes steps the probe sees.
3. **The history** (:mod:`sparkd.supervisor.stephistory`) learns from every reading; the shell keeps it per identity.
4. **A warning** for status: a process whose probe turned itself off, or no step file at all
   :data:`MISSING_AFTER_S` after vLLM served (the plugin did not load: vLLM too old, ``VLLM_PLUGINS`` without it, an
   old container without the probe's mounts). vLLM is supervised as without the probe.
5. **The canary's cadence** (:func:`canary_every`): while the probe reads vLLM's ranks, a wedge of an idle engine is
   named :data:`~sparkd.supervisor.stephistory.StepLimits` ``floor_s`` after a request's step begins; the canary, the
   only request an idle engine gets, then runs at least every :data:`PROBE_CANARY_S`, so such a wedge is named within
   15 s of its start.
6. **At rest, fewer readings** (:func:`read_due`): a wedge is a rank inside a step, or an engine that begins none for
   a request that waits; while every rank rests (none inside a step, none ended one within :data:`RESTING_AFTER_S`,
   no engine holds a request) and no canary of sparkd's waits, the files are read every :data:`RESTING_READ_S`, not
   every second: a step that begins then is read within that, and its limit (``floor_s`` at least) is longer. The
   shell sleeps until that read (:func:`read_wait`) rather than waking every second to find nothing due; a canary
   sent wakes it at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sparkd.supervisor import health, stall
from sparkd.supervisor.stephistory import StepHistory, StepLimits, completed_steps, expected_s, learn, limit_s
from sparkd.supervisor.steps import NodeSteps, Pending, StepVerdict, judge_steps, probe_off, views
from sparkd.supervisor.vocabulary import Observation

if TYPE_CHECKING:
    from sparkd.config import HealthConfig

__all__ = ["MISSING_AFTER_S", "PROBE_CANARY_S", "READ_EVERY_S", "RESTING_AFTER_S", "RESTING_READ_S", "StepWatch",
           "canary_every", "canary_pending", "limits_of", "observe_steps", "progressing", "read_due", "read_wait",
           "resting"]

READ_EVERY_S = 1.0  # the shell reads every node's step files this often while vLLM serves (rule 6: at rest, less)
RESTING_READ_S = 5.0  # rule 6: the readings' interval while every rank rests
RESTING_AFTER_S = 3.0  # rule 6: a rank rests this long after its last step ended (the canary comes every 8 s)
PROBE_CANARY_S = 8.0  # the canary's longest interval while the probe reads vLLM's ranks (rule 5)
MISSING_AFTER_S = 10.0  # no step file this long after vLLM served: the plugin did not load (rule 4)


@dataclass(frozen=True)
class StepWatch:
    """What the probe's watch of one instance keeps between readings."""

    history: StepHistory = field(default_factory=StepHistory)
    nodes: tuple[NodeSteps, ...] = ()  # the last reading of every node
    serving_since: float | None = None  # the first reading while vLLM served
    seen: bool = False  # a step record was read for this instance
    warning: str | None = None  # what status says of the probe (rule 4)
    verdict: StepVerdict | None = None  # the verdict it gave, if any


def limits_of(cfg: HealthConfig) -> StepLimits:
    """The step limits under ``[health]`` in force: capped at vLLM's execute timeout."""
    return StepLimits(cap_s=stall.execute_timeout(cfg))


def canary_pending(sent_at: float | None) -> Pending | None:
    """sparkd's canary in flight since ``sent_at``, as the request the rules know waits."""
    return None if sent_at is None else Pending(sent_at, "a test generation sparkd sent is unanswered")


def canary_every(w: StepWatch, every_s: float) -> float:
    """The canary's interval: ``every_s`` (``[health] canary_interval_s``), at most :data:`PROBE_CANARY_S` while the
    probe reads vLLM's ranks (rule 5)."""
    return min(every_s, PROBE_CANARY_S) if w.seen else every_s


def resting(w: StepWatch, now: float) -> bool:
    """Every rank the last reading showed rests (rule 6): none inside a step, none ended one within
    :data:`RESTING_AFTER_S`, no engine holding a request; a probe seen off everywhere rests too. Before any record
    was read, nothing rests (the missing plugin's warning waits on the readings)."""
    if not w.seen:
        return False
    live = [v for v in views(w.nodes, now) if v.record.phase != "off"]
    return all(not v.record.in_step and v.idle_s >= RESTING_AFTER_S and v.record.held <= 0 for v in live)


def read_due(w: StepWatch, now: float, last_read: float | None, pending: Pending | None) -> bool:
    """Whether the shell reads the step files at ``now`` (it asks every :data:`READ_EVERY_S`): always while a rank
    steps or a canary of sparkd's waits, every :data:`RESTING_READ_S` at rest (rule 6)."""
    if last_read is None or pending is not None or now - last_read >= RESTING_READ_S:
        return True
    return not resting(w, now)


def read_wait(w: StepWatch, now: float, last_read: float | None, pending: Pending | None) -> float:
    """How long the shell sleeps before it asks :func:`read_due` again: :data:`READ_EVERY_S`, or, while every rank
    rests and no canary of sparkd's waits, until the resting read is due (rule 6): a wake-up a second at rest would
    only find that nothing is due. A canary sent in the meantime wakes the shell at once (it makes a read due)."""
    if last_read is None or pending is not None or not resting(w, now):
        return READ_EVERY_S
    return max(READ_EVERY_S, RESTING_READ_S - (now - last_read))


def progressing(nodes: Sequence[NodeSteps], history: StepHistory, now: float, limits: StepLimits) -> bool:
    """The records show vLLM's ranks stepping within their limits (rule 2): a worker rank inside a step or one that
    ended a step within ``floor_s``, and every worker inside a step within a limit its identity's history backs
    (with nothing seen yet, or a step of unknown size, there is no yardstick: it vouches for nothing)."""
    workers = [v for v in views(nodes, now) if v.record.role == "worker" and v.record.phase != "off"]
    inside = [v for v in workers if v.record.in_step]
    for v in inside:
        if expected_s(history, v.record.tokens) is None or v.inside_s >= limit_s(history, v.record.tokens, limits):
            return False
    return bool(inside) or any(v.idle_s < limits.floor_s for v in workers)


def observe_steps(w: StepWatch, t: health.HealthTracker, nodes: Sequence[NodeSteps], now: float, cfg: HealthConfig,
                  *, pending: Pending | None = None) -> tuple[StepWatch, health.HealthTracker, Observation | None]:
    """Fold one reading of every node's step files, taken at monotonic ``now``, into the watch and the tracker."""
    if not t.watching:
        return replace(w, nodes=tuple(nodes)), t, None
    limits = limits_of(cfg)
    hold = (t.clock.jit_what or "a JIT compile") if stall.held(t.clock, now, cfg) else None
    verdict = judge_steps(nodes, w.history, now, limits, pending=pending, hold=hold)
    stepping = verdict is None and progressing(nodes, w.history, now, limits)
    failure, seconds = (verdict.failure(), verdict.seconds) if verdict is not None else (None, None)
    t, obs = health.observe_probe(t, failure, stepping, now, wedged_for_s=seconds)
    records = [r for n in nodes for r in n.records]
    seen = w.seen or bool(records)
    since = w.serving_since if w.serving_since is not None else now
    w = replace(w, history=learn(w.history, completed_steps(records), limits), nodes=tuple(nodes),
                serving_since=since, seen=seen, verdict=verdict or w.verdict,
                warning=_warning(nodes, seen, now - since))
    return w, t, obs


def _warning(nodes: Sequence[NodeSteps], seen: bool, serving_s: float) -> str | None:
    off = probe_off(nodes)
    if off:
        return (f"the step probe turned itself off in vLLM ({'; '.join(off)}); vLLM runs and is supervised without "
                "it")
    if not seen and serving_s >= MISSING_AFTER_S:
        return (f"no step file {serving_s:.0f} s after vLLM served although [health] step_probe is on: the probe did "
                "not load in vLLM (vLLM older than 0.9, VLLM_PLUGINS set without sparkd_probe, or a container made "
                "without the probe's mounts: `sparkctl recreate`); vLLM is supervised without it")
    return None
