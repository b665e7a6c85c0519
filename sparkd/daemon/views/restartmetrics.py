"""What a restart costs, in metrics: the drain of the stop in progress (``sparkd_draining``, the requests still in
flight and the seconds left) and the last start's compile cache verdict (hit or miss, the compile's seconds, a miss
where a hit was expected). Functions of the node's state, collected at scrape time by
:mod:`sparkd.daemon.views.metrics`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from sparkd.daemon.loop.nodestate import NodeState
from sparkd.supervisor.compilelog import Verdict
from sparkd.supervisor.drainlog import DrainState


def families(keys: list[str], values: list[str], node: NodeState, now: float) -> Iterator[Any]:
    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=keys)
        family.add_metric(values, value)
        return family

    drain = node.drain
    draining = drain is not None and drain.state is DrainState.draining
    yield gauge("sparkd_draining", "1 while a stop waits for vLLM's requests in flight to finish ([stop] drain_s).",
                1.0 if draining else 0.0)
    if drain is not None and drain.in_flight is not None:
        yield gauge("sparkd_drain_requests_in_flight", "Requests vLLM still drains, while a stop drains.",
                    float(drain.in_flight))
    if drain is not None:
        yield gauge("sparkd_drain_seconds_left", "Seconds to the end of vLLM's drain, while a stop drains.",
                    drain.left_s(now))
    cache = node.timing.compile if node.timing is not None else None
    if cache is None or cache.verdict in (Verdict.unknown, Verdict.off):
        return
    assert node.timing is not None
    yield gauge("sparkd_compile_cache_hit", "1 when the last start loaded vLLM's compile cache, 0 when it compiled.",
                1.0 if cache.verdict is Verdict.hit else 0.0)
    took = cache.took_s()
    if took is not None:
        yield gauge("sparkd_compile_seconds", "Seconds the last start spent compiling (or loading) the model.", took)
    yield gauge("sparkd_compile_cache_unexpected_miss", "1 when the last start missed the compile cache the start "
                "before it stored (same image, model and flags).", 1.0 if node.timing.unexpected_miss else 0.0)
