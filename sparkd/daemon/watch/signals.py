"""The health signals of a serving vLLM: what its watch asks it now and then, each judged by a pure rule.

:class:`~sparkd.daemon.watch.instance.InstanceWatch` runs every signal of :data:`SIGNALS` through one loop: sleep
``every_s`` (read from the current config each round), and while vLLM serves, probe, then fold the reading into
the health tracker (what a signal is: :mod:`sparkd.daemon.watch.healthsignal`). A new signal is one module (its probe,
its rule and its ``Signal``) and one line in :data:`SIGNALS`.

``/health`` and vLLM's ``/metrics`` are not signals of this list: they are the readiness loop, which also runs
before vLLM serves (every 0.5 s until the first 200) and counts the clients connected before each scrape.
"""

from __future__ import annotations

from typing import Any

from sparkd.daemon.watch.healthsignal import Probes, Signal
from sparkd.supervisor import health
from sparkd.supervisor.readings import ProbeResult


async def _canary(probes: Probes) -> ProbeResult:
    return await probes.canary()


# The generation canary: one token now and then (`[health] canary`, `canary_interval_s`); health.observe_canary.
CANARY: Signal[ProbeResult] = Signal("canary", _canary, health.observe_canary, lambda cfg: cfg.canary_interval_s,
                                     on=lambda cfg: cfg.canary, own_connection=True)

SIGNALS: tuple[Signal[Any], ...] = (
    CANARY,
)
