"""Every grace of a stop, derived from ``[stop] drain_s`` in this one place. Pure.

vLLM started with ``--shutdown-timeout N`` drains for up to N s on SIGTERM (in-flight requests finish, new ones are
refused), then tears down; started with 0 it aborts them. Whatever waits on a stop must outlast that, or it kills a
drain early. Rules:

1. A drained stop (a stop sparkd chooses while vLLM serves) waits the launch's drain plus ``[supervisor]
   stop_grace_s`` (the teardown that follows) before SIGKILL: :func:`drained_grace_s`.
2. The launch's drain is what vLLM was started with (:func:`launched_drain_s` reads it from the argv), not the
   config now: a reload that changes ``drain_s`` reaches vLLM only with its next launch.
3. What stops vLLM from outside sparkd must wait as long: a docker-run container's own stop timeout
   (:func:`container_stop_timeout_s`), the unit's ``TimeoutStopSec`` (:func:`unit_stop_timeout_s`: the drained
   grace, the wait for the GPU memory's release and the sweep), a caller waiting for a stop to finish
   (:func:`stop_wait_s`).
4. Which grace a stop gets follows from why it stops (:func:`plan_stop`), first match wins: the memory guard's
   stop has its own grace and skips the drain; a wedged vLLM (a hang, stall or lost-peer verdict, or its peer
   rank gone) gets ``hung_stop_grace_s``; an operator's stop ``now`` skips the drain; a stop answering any other
   failure, or of a vLLM not serving yet, has no request to wait for (``stop_grace_s``); else it drains.
5. Skipping the drain of a vLLM launched with one needs sparkd to end it (``cut``): vLLM ignores a second SIGTERM
   and cannot be told to abort instead. Nor does ending its engine end the requests: measured on the real vLLM
   0.32 (tests/data/vllm-drain-032.json), once the engine is gone with requests in it (vLLM's own abort at
   ``--shutdown-timeout 0``, a drain run out, the engine killed) their streams get nothing more and the API server
   waits for those clients forever. So a stop that skips the drain SIGKILLs the whole tree as soon as vLLM says
   requests are in flight (:mod:`sparkd.supervisor.drainlog`: draining with a count, or stranded), and lets an idle
   vLLM end on its own within the grace. The same holds for any drain vLLM reports stranded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sparkd.config import Config
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import wedged

__all__ = ["FLAG", "SWEEP_S", "WAIT_MARGIN_S", "StopKind", "StopPlan", "container_stop_timeout_s", "drained_grace_s",
           "launched_drain_s", "plan_for", "plan_stop", "stop_wait_s", "unit_stop_timeout_s"]

FLAG = "--shutdown-timeout"
SWEEP_S = 30.0  # after the stop: the stale-process and /dev/shm sweep, the instance record
WAIT_MARGIN_S = 30.0  # a caller waiting on a stop (sparkctl, a rank stop) beyond its grace


class StopKind(StrEnum):
    drain = "drain"  # a stop sparkd chooses while vLLM serves: requests in flight finish
    now = "now"  # an operator's stop that will not wait for them
    guard = "guard"  # the memory guard's stop, with its own grace
    hung = "hung"  # a wedged vLLM: it would ignore the drain
    failure = "failure"  # a stop answering a failure that is not a wedge: nothing left to finish
    loading = "loading"  # vLLM does not serve yet: no request can be in flight


@dataclass(frozen=True)
class StopPlan:
    """How one stop goes: SIGTERM; ``cut``: SIGKILL the tree as soon as vLLM reports requests in flight (rule 5);
    SIGKILL what is left after ``grace_s``."""

    kind: StopKind
    grace_s: float
    drain_s: float  # the part of the grace vLLM may spend on requests in flight (0: none)
    cut: bool  # vLLM was launched with a drain this stop skips
    source: str  # where the grace comes from, in the words of the config

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "grace_s": self.grace_s, "drain_s": self.drain_s, "cut": self.cut,
                "source": self.source}


def launched_drain_s(argv: Sequence[str]) -> int:
    """The drain vLLM was started with: the last ``--shutdown-timeout`` of its argv (vLLM's argparse keeps the last);
    0, vLLM's default, when there is none or it is no whole number."""
    value = None
    for i, word in enumerate(argv):
        if word == FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(FLAG + "="):
            value = word.split("=", 1)[1]
    return int(value) if value is not None and value.isdigit() else 0


def drained_grace_s(cfg: Config, drain_s: float | None = None) -> float:
    """SIGTERM → SIGKILL of a drained stop: the drain (``drain_s``, default the config's) and the teardown after it."""
    return float(cfg.stop.drain_s if drain_s is None else drain_s) + cfg.supervisor.stop_grace_s


def container_stop_timeout_s(cfg: Config) -> int:
    """A docker-run container's own stop timeout: ``[container] stop_timeout_s``, else the drained grace."""
    configured = cfg.container.stop_timeout_s
    return configured if configured is not None else math.ceil(drained_grace_s(cfg))


def stop_wait_s(cfg: Config, drain_s: float | None = None) -> float:
    """How long a caller waits for a stop to be done (``sparkctl stop``, the head's stop of a rank)."""
    return drained_grace_s(cfg, drain_s) + WAIT_MARGIN_S


def unit_stop_timeout_s(cfg: Config) -> float:
    """The least ``TimeoutStopSec`` of the unit running sparkd: sparkd's shutdown stops vLLM with a drain, waits for
    its GPU memory to come back and sweeps; systemd must not SIGKILL sparkd (and leave vLLM) before that."""
    return drained_grace_s(cfg) + cfg.supervisor.gpu_release_timeout_s + SWEEP_S


def plan_stop(cfg: Config, *, launched_drain: int, now: bool = False, guard_grace_s: float | None = None,
              wedged: bool = False, failed: bool = False, serving: bool = True,
              wedge: str = "vLLM is wedged") -> StopPlan:
    """The plan of one stop of a vLLM launched with ``--shutdown-timeout launched_drain``.

    ``guard_grace_s``: the memory guard's grace (it rides on its stop); ``wedged``: a wedge verdict or a peer rank
    gone under it (``wedge`` says which, in words); ``failed``: the stop answers another failure; ``serving``: vLLM
    served its clients (ready or degraded; a headless rank serves none)."""
    sup, drains = cfg.supervisor, launched_drain > 0
    if guard_grace_s is not None:
        return StopPlan(StopKind.guard, guard_grace_s, 0.0, drains, "the memory guard's stop_grace_s")
    if wedged:
        return StopPlan(StopKind.hung, sup.hung_stop_grace_s, 0.0, False, f"hung_stop_grace_s: {wedge}")
    if now:
        return StopPlan(StopKind.now, sup.stop_grace_s, 0.0, drains, "stop_grace_s: the stop skips the drain")
    if failed:
        return StopPlan(StopKind.failure, sup.stop_grace_s, 0.0, False, "stop_grace_s: nothing left to finish")
    if not serving:
        return StopPlan(StopKind.loading, sup.stop_grace_s, 0.0, False, "stop_grace_s: vLLM does not serve yet")
    if not drains:
        return StopPlan(StopKind.drain, sup.stop_grace_s, 0.0, False, "stop_grace_s (drain_s = 0: no drain)")
    return StopPlan(StopKind.drain, drained_grace_s(cfg, launched_drain), float(launched_drain), False,
                    f"drain_s {launched_drain} s + stop_grace_s {sup.stop_grace_s:g} s")


def plan_for(stop: v.Stop, cfg: Config, *, launched_drain: int, headless: bool = False) -> StopPlan:
    """The plan of the lifecycle's ``Stop`` action, under the config its state was decided in: the guard's grace rides
    on it, a wedge verdict (or ``hung``: a peer rank died under it) is the short grace, ``now`` skips the drain, a
    failure or a start not serving yet has no request to wait for. A headless rank serves no client: its requests
    live on the head, which stops it only once its own are done."""
    failure = stop.failure
    wedge = f"vLLM was wedged ({failure.cls.value})" if failure is not None and wedged(failure) else \
        "its peer rank is gone"
    return plan_stop(cfg, launched_drain=launched_drain, now=stop.now, guard_grace_s=stop.grace_s,
                     wedged=wedged(failure) or stop.hung, wedge=wedge, failed=failure is not None,
                     serving=stop.serving and not headless)
