"""What a health signal is (:class:`Signal`), and the port its probes read vLLM through (:class:`Probes`).

A signal is a probe (one reading through the instance's ``Probes``: a named one, or any page of vLLM's HTTP API
with :meth:`Probes.fetch`), the rule that folds the reading into the instance's
:class:`~sparkd.supervisor.health.HealthTracker` (pure: ``(tracker, reading, now, cfg) -> (tracker, observation or
None)``, the shape of ``health.observe_*``), and its cadence. A signal's module lives in the core
(:mod:`sparkd.supervisor.signals`, listed in ``SIGNALS`` there): its probe only names what to ask through the port,
the shell's watch (:mod:`sparkd.daemon.watch.instance`) runs it; a rule that keeps state of its own keeps it in
``HealthTracker.signals[name]``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from sparkd.config import HealthConfig
from sparkd.supervisor import health
from sparkd.supervisor.readings import MetricsOff, ProbeResult, VllmMetrics

R = TypeVar("R")


@dataclass(frozen=True)
class Answer:
    """What a page of vLLM's HTTP API answered: its status and body, and how long it took."""

    status: int
    body: str
    latency_s: float


class Probes(Protocol):
    """vLLM's HTTP surface as the health layers see it (sparkd.daemon.watch.probes.HttpProbes, or a fake)."""

    async def health(self) -> ProbeResult: ...

    async def metrics(self) -> VllmMetrics | MetricsOff | None: ...

    async def canary(self) -> ProbeResult: ...

    async def fetch(self, path: str) -> Answer | ProbeResult:
        """``GET path`` (``/v1/models``): the answer, or why there was none (refused, timeout, error)."""

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Signal(Generic[R]):
    name: str
    probe: Callable[[Probes], Awaitable[R]]
    rule: Callable[[health.HealthTracker, R, float, HealthConfig], health.Step]
    every_s: Callable[[HealthConfig], float]  # seconds between readings (read again each time: a reload)
    on: Callable[[HealthConfig], bool] = lambda cfg: True  # whether it runs now (read at every round)
    # Its probe opens a connection on vLLM's API port while it waits: not one of vLLM's clients.
    own_connection: bool = False
