"""Health signals: what the watch of a serving vLLM asks it now and then, each with the pure rule that judges it.

A :class:`Signal` is a probe (one reading through the instance's :class:`Probes`), the rule that folds the reading
into the instance's :class:`~sparkd.supervisor.health.HealthTracker` (pure: ``(tracker, reading, now, cfg) ->
(tracker, observation or None)``, the shape of ``health.observe_*``), and its cadence. :class:`~sparkd.daemon.watch.
InstanceWatch` runs every signal of :data:`SIGNALS` through one loop: sleep ``every_s``, and while vLLM serves,
probe, then fold. A rule that keeps state of its own keeps it in ``HealthTracker.signals[name]``.

A new signal is one module (its probe and its rule, and its ``Signal``) and one line in :data:`SIGNALS`.

``/health`` and vLLM's ``/metrics`` are not signals of this list: they are the readiness loop, which also runs
before vLLM serves (every 0.5 s until the first 200) and counts the clients connected before each scrape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sparkd.config import HealthConfig
from sparkd.supervisor import health
from sparkd.supervisor.readings import MetricsOff, ProbeResult, VllmMetrics

R = TypeVar("R")


class Probes(Protocol):
    """vLLM's HTTP surface as the health layers see it (sparkd.daemon.probes.HttpProbes, or a fake)."""

    async def health(self) -> ProbeResult: ...

    async def metrics(self) -> VllmMetrics | MetricsOff | None: ...

    async def canary(self) -> ProbeResult: ...

    async def aclose(self) -> None: ...


Rule = Callable[[health.HealthTracker, Any, float, HealthConfig], health.Step]


@dataclass(frozen=True)
class Signal(Generic[R]):
    name: str
    probe: Callable[[Probes], Awaitable[R]]
    rule: Callable[[health.HealthTracker, R, float, HealthConfig], health.Step]
    every_s: Callable[[HealthConfig], float | None]  # seconds between readings; None: the signal is off
    # Its probe opens a connection on vLLM's API port while it waits: not one of vLLM's clients.
    own_connection: bool = False


async def _canary(probes: Probes) -> ProbeResult:
    return await probes.canary()


# The generation canary: one token now and then (`[health] canary`, `canary_interval_s`); health.observe_canary.
CANARY: Signal[ProbeResult] = Signal("canary", _canary, health.observe_canary,
                                     lambda cfg: cfg.canary_interval_s if cfg.canary else None, own_connection=True)

SIGNALS: tuple[Signal[Any], ...] = (
    CANARY,
)
