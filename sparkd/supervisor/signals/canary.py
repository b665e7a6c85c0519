"""The generation canary: one token now and then (``[health] canary``, ``canary_interval_s``), judged by
:func:`sparkd.supervisor.health.observe_canary` (a hang: no answer while ``/health`` says 200)."""

from __future__ import annotations

from sparkd.supervisor import health
from sparkd.supervisor.healthsignal import Probes, Signal
from sparkd.supervisor.readings import ProbeResult


async def _canary(probes: Probes) -> ProbeResult:
    return await probes.canary()


CANARY: Signal[ProbeResult] = Signal("canary", _canary, health.observe_canary, lambda cfg: cfg.canary_interval_s,
                                     on=lambda cfg: cfg.canary, own_connection=True)
