"""sparkd's /metrics text is prometheus_client's generate_latest, byte for byte."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sparkd.daemon.views.metrics import text_format


class Odd(Collector):
    def collect(self):  # type: ignore[no-untyped-def]
        family = GaugeMetricFamily("sparkd_odd", 'Help with a \\ and a\nnewline.', labels=["node", "reason"])
        family.add_metric(["n1", 'a "quoted"\\ back\nslash'], 1.5)
        family.add_metric(["n2", ""], float("inf"))
        yield family


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    Gauge("sparkd_g", "A gauge.", ["node", "state"], registry=reg).labels("n", "ready").set(1)
    Counter("sparkd_failures", "Failures by class.", ["node", "class"], registry=reg).labels("n", "oom").inc(3)
    Info("sparkd_build", "Build.", ["node"], registry=reg).labels("n").info({"version": "0.1.0"})
    Histogram("sparkd_start_duration_seconds", "Start.", ["node"], buckets=(1, 5, 15), registry=reg).labels(
        "n").observe(3.2)
    reg.register(Odd())
    return reg


def test_the_text_is_generate_latests_byte_for_byte() -> None:
    reg = registry()
    assert text_format(reg) == generate_latest(reg)


def test_a_name_prometheus_client_must_escape_goes_through_it() -> None:
    reg = CollectorRegistry(auto_describe=False)
    Gauge("sparkd_g", "A gauge.", ["node.name"], registry=reg).labels("n").set(1)
    assert text_format(reg) == generate_latest(reg)
