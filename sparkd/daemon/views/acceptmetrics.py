"""The acceptance gate's metric families (issue 37), from the node's state: the verdict standing for the running
instance (SparkdAnswersChanged reads it), whether it keeps a start from ready, the last run's seconds and bad outputs
per concurrency level, the runs by kind and verdict. Every series from 0, so a first change is an increase."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sparkd.supervisor.acceptance.gate import Part, Verdict
from sparkd.supervisor.acceptance.standing import GateKind, Standing


def families(keys: list[str], values: list[str], standing: Standing) -> Iterator[Any]:
    last = standing.last
    verdict = GaugeMetricFamily("sparkd_acceptance_verdict", "1 for the acceptance gate's verdict standing for the "
                                "running vLLM (all 0: none yet).", labels=[*keys, "verdict"])
    for v in Verdict:
        verdict.add_metric([*values, v.value], 1.0 if last is not None and last.verdict is v else 0.0)
    yield verdict
    refused = GaugeMetricFamily("sparkd_acceptance_refused", "1 while the acceptance gate keeps the start from ready "
                                "([acceptance] refuse).", labels=keys)
    refused.add_metric(values, 1.0 if last is not None and last.refuse else 0.0)
    yield refused
    if last is not None:
        seconds = GaugeMetricFamily("sparkd_acceptance_seconds", "Seconds the last acceptance gate took.",
                                    labels=[*keys, "kind"])
        seconds.add_metric([*values, standing.last_kind.value if standing.last_kind else ""], last.seconds)
        yield seconds
        garble = next((p for p in last.parts if p.part is Part.garble), None)
        if garble is not None:
            bad = GaugeMetricFamily("sparkd_acceptance_bad_outputs", "Garbled answers at each concurrency level of "
                                    "the last gate that asked them.", labels=[*keys, "level"])
            for level, n in sorted(dict(garble.facts.get("bad_outputs") or {}).items(), key=lambda kv: int(kv[0])):
                bad.add_metric([*values, str(level)], float(n))
            yield bad
    runs = CounterMetricFamily("sparkd_acceptance_runs", "Acceptance gate runs by kind (start, adopted, replay, wake, "
                               "accept) and verdict.", labels=[*keys, "kind", "verdict"])
    for kind in GateKind:
        for v in Verdict:
            runs.add_metric([*values, kind.value, v.value], float(standing.runs.get((kind, v), 0)))
    yield runs
