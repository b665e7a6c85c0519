"""Prometheus metrics: every family sparkd exports, defined here, collected at scrape time (node_exporter's way).

Nothing is kept twice: a scrape reads the machine, the startup progress, the health tracker, the counters,
the guard's latest sample (or one plain reading of /proc/meminfo without the guard) and the group, through the
read-only :class:`~sparkd.daemon.views.status.StatusView`, so the numbers never drift from the status. Conventions:
``sparkd_`` prefix, base units, ``_total`` counters, ``_seconds``, ``_bytes``, ``_info``. Every family carries the
``node`` label and, in a group, ``rank`` and ``group`` (the head's name), so one Prometheus watches several groups.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sparkd import __version__
from sparkd.config import Config
from sparkd.daemon.effects.restartgate import StartGuard
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.views import acceptmetrics, checkmetrics, restartmetrics
from sparkd.daemon.views.flightrecords import FlightRecorder
from sparkd.daemon.views.gpumetrics import gpu_families
from sparkd.daemon.views.status import StatusView
from sparkd.guard.guard import Guard
from sparkd.guard.meminfo import MemInfo, read_meminfo
from sparkd.guard.policy import Action as GuardAction
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.progress import Phase
from sparkd.supervisor.states import SERVING, State, came_up

# Cold starts of the real model take 8-10 minutes; the stand-in takes seconds.
START_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600)


class _Families:
    """Builds families that all carry this node's identity labels."""

    def __init__(self, identity: dict[str, str]) -> None:
        self.keys = list(identity)
        self.values = list(identity.values())

    def gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=self.keys)
        family.add_metric(self.values, value)
        return family

    def counter(self, name: str, doc: str, extra: list[str]) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=[*self.keys, *extra])

    def add(self, family: Any, value: float, *extra: str) -> None:
        family.add_metric([*self.values, *extra], value)


class SparkdCollector(Collector):
    def __init__(self, view: StatusView) -> None:
        self.view = view
        self._made: tuple[weakref.ref[Config], _Families] | None = None  # keeps no config alive

    @property
    def f(self) -> _Families:
        """Families with the node's identity labels as the config in force says them."""
        cfg = self.view.node().config
        if self._made is None or self._made[0]() is not cfg:
            identity = {"node": cfg.node.name}
            if self.view.seen.group is not None:
                identity["rank"] = str(cfg.node_rank)
                identity["group"] = f"{cfg.master_addr}:{cfg.master_port}"  # what every rank of one group shares
            self._made = (weakref.ref(cfg), _Families(identity))
        return self._made[1]

    def collect(self) -> Iterator[Any]:
        f, view, node = self.f, self.view, self.view.node()
        m, cfg = node.machine, node.config
        info = InfoMetricFamily("sparkd_build", "sparkd build information.", labels=f.keys)
        info.add_metric(f.values, {"version": __version__, "role": cfg.node.role.value,
                                   "runtime": cfg.runtime.value})
        yield info
        state = GaugeMetricFamily("sparkd_state", "1 for the current lifecycle state.", labels=[*f.keys, "state"])
        for s in State:
            f.add(state, 1.0 if m.state is s else 0.0, s.value)
        yield state
        yield f.gauge("sparkd_ready", "1 when vLLM serves (ready or degraded).", 1.0 if m.state in SERVING else 0.0)
        yield f.gauge("sparkd_breaker_open", "1 when the restart breaker is open.", 1.0 if m.breaker_open else 0.0)
        now = view.clock.now()
        backoff = max(0.0, m.deadline - now) if m.state is State.backoff and m.deadline else 0.0
        yield f.gauge("sparkd_backoff_seconds", "Seconds until the next start attempt.", backoff)
        starting = m.state in (State.starting, State.accepting) and m.started_at is not None
        yield f.gauge("sparkd_start_elapsed_seconds", "Seconds since the current launch, while it starts (else 0).",
                      now - m.started_at if starting and m.started_at is not None else 0.0)
        yield f.gauge("sparkd_start_budget_seconds", "The startup budget of a launch ([supervisor] "
                      "startup_timeout_s).", node.limits.startup_timeout_s)
        yield f.gauge("sparkd_daemon_degraded", "1 when sparkd itself cannot do part of its job (see status).",
                      1.0 if view.facts.problems() else 0.0)
        yield from self._counters()
        yield from self._startup(node)
        yield from self._health()
        yield from self._preflight()
        yield from self._memory(view.seen.guard)
        gpu = view.seen.gpu
        yield from gpu_families(f.keys, f.values, gpu.launch_devices() if gpu else [])
        yield from self._peers()
        yield from checkmetrics.families(f.keys, f.values, view.facts.proofs())
        yield from restartmetrics.families(f.keys, f.values, node, now)
        yield from acceptmetrics.families(f.keys, f.values, node.acceptance)

    def _counters(self) -> Iterator[Any]:
        f, counters = self.f, self.view.seen.counters
        restarts = f.counter("sparkd_restarts", "Restarts of vLLM by what caused them.", ["reason"])
        # Every reason from 0 (each failure class, the operator): increase() sees the first restart too.
        seen = {**dict.fromkeys([*(cls.value for cls in FailureClass), "operator", "reset"], 0),
                **self.view.history.restarts}
        for reason, n in sorted(seen.items()):
            f.add(restarts, n, reason)
        yield restarts
        failures = f.counter("sparkd_failures", "Failures of vLLM by class.", ["class"])
        for cls in FailureClass:  # every class from 0, so rate() and increase() see the first failure
            f.add(failures, counters.failures.get(cls.value, 0), cls.value)
        yield failures
        if counters.last_exit_code is not None:
            yield f.gauge("sparkd_last_exit_code", "Exit status of the last vLLM process that ended.",
                          counters.last_exit_code)

    def _startup(self, node: NodeState) -> Iterator[Any]:
        f = self.f
        phase = GaugeMetricFamily("sparkd_startup_phase", "1 for vLLM's current startup phase.",
                                  labels=[*f.keys, "phase"])
        current = node.startup.phase if node.instance is not None else None
        for p in Phase:
            f.add(phase, 1.0 if p is current else 0.0, p.value)
        yield phase
        if node.startup.kv_cache_tokens is not None:
            yield f.gauge("sparkd_vllm_kv_cache_tokens", "GPU KV cache size vLLM reported, in tokens.",
                          node.startup.kv_cache_tokens)
        timing = node.timing.to_json() if node.timing is not None else None
        if timing is not None:
            steps = GaugeMetricFamily("sparkd_launch_step_seconds", "Seconds sparkd spent in each step of the last "
                                      "start, from the start request to vLLM's exec.", labels=[*f.keys, "step"])
            for step, seconds in timing["steps_s"].items():
                f.add(steps, seconds, step)
            yield steps
            phases = GaugeMetricFamily("sparkd_startup_phase_seconds", "Seconds vLLM spent in each cold-start "
                                       "phase of the last start.", labels=[*f.keys, "phase"])
            for phase_name, seconds in timing["phases_s"].items():
                f.add(phases, seconds, phase_name)
            yield phases
        if node.startup.max_concurrency is not None:
            yield f.gauge("sparkd_vllm_max_concurrency", "Maximum concurrency at max_model_len vLLM reported.",
                          node.startup.max_concurrency)

    def _health(self) -> Iterator[Any]:
        f, health = self.f, self.view.seen.watching.health()
        probes = f.counter("sparkd_probes", "Health probes by probe and result.", ["probe", "result"])
        latency = GaugeMetricFamily("sparkd_probe_latency_seconds", "Latency of the last probe.",
                                    labels=[*f.keys, "probe"])
        if health is not None:
            for (probe, outcome), n in sorted(health.probes_total.items()):
                f.add(probes, n, probe, str(outcome))
            for probe, seconds in sorted(health.last_latency_s.items()):
                f.add(latency, seconds, probe)
        yield probes
        yield latency

    def _preflight(self) -> Iterator[Any]:
        f = self.f
        results = GaugeMetricFamily("sparkd_preflight_check", "Verdict of each check in the last preflight.",
                                    labels=[*f.keys, "check", "verdict"])
        durations = GaugeMetricFamily("sparkd_preflight_check_duration_seconds",
                                      "Duration of each check in the last preflight.", labels=[*f.keys, "check"])
        for r in self.view.seen.preflight.last:
            f.add(results, 1.0, str(r["id"]), str(r["verdict"]))
            f.add(durations, float(r["duration_s"]), str(r["id"]))  # type: ignore[arg-type]
        yield results
        yield durations

    def _memory(self, guard: Guard | None) -> Iterator[Any]:
        f = self.f
        sample = guard.latest if guard is not None else None
        mem: MemInfo | None = sample.mem if sample is not None else read_meminfo()
        if mem is not None:
            for name, value, doc in (
                ("sparkd_memory_total_bytes", mem.mem_total, "MemTotal."),
                ("sparkd_memory_available_bytes", mem.mem_available, "MemAvailable."),
                ("sparkd_memory_free_bytes", mem.mem_free, "MemFree."),
                ("sparkd_memory_page_cache_bytes", mem.cached, "Page cache (Cached)."),
                ("sparkd_memory_shmem_bytes", mem.shmem, "Shared memory (Shmem)."),
                ("sparkd_memory_driver_residual_bytes", mem.driver_residual,
                 "MemTotal - MemFree - Active - Inactive - Slab - PageTables - Unevictable (GPU driver on GB10)."),
                ("sparkd_memory_swap_used_bytes", mem.swap_total - mem.swap_free, "Swap in use."),
            ):
                yield f.gauge(name, doc, value)
        if guard is not None:
            yield from self._guard(guard)

    def _guard(self, guard: Guard) -> Iterator[Any]:
        f, sample = self.f, guard.latest
        if sample is not None:
            if sample.psi is not None:
                psi = GaugeMetricFamily("sparkd_memory_pressure_avg10_ratio", "PSI memory avg10 as a ratio.",
                                        labels=[*f.keys, "kind"])
                f.add(psi, sample.psi.some_avg10 / 100, "some")
                f.add(psi, sample.psi.full_avg10 / 100, "full")
                yield psi
            nvrm = f.counter("sparkd_kernel_nvrm_no_memory", "NV_ERR_NO_MEMORY lines in the kernel log.", [])
            f.add(nvrm, sample.nvrm_errors)
            yield nvrm
        actions = f.counter("sparkd_guard_actions", "Memory guard actions by kind.", ["action"])
        for action in GuardAction:
            if action is not GuardAction.ok:
                f.add(actions, guard.counters.actions.get(action.value, 0), action.value)
        yield actions
        yield f.gauge("sparkd_guard_start_allowed", "1 when the guard allows vLLM to start.",
                      1.0 if guard.start_allowed else 0.0)
        floors = GaugeMetricFamily("sparkd_guard_floor_bytes", "The guard's MemAvailable floors ([guard] *_below): "
                                   "SparkdMemoryLow fires under warn.", labels=[*f.keys, "floor"])
        for floor in ("warn", "refuse_start", "stop", "kill"):
            f.add(floors, float(getattr(guard.cfg, f"{floor}_below")), floor)
        yield floors
        trend = guard.trend
        if trend is not None:
            yield f.gauge("sparkd_guard_leak_slope_bytes_per_second",
                          "Theil-Sen slope of MemAvailable over the trend window.", trend.slope)
            if trend.seconds_to_floor is not None:
                yield f.gauge("sparkd_guard_seconds_to_floor",
                              "Predicted seconds until MemAvailable reaches the stop floor.", trend.seconds_to_floor)

    def _peers(self) -> Iterator[Any]:
        group = self.view.seen.group
        if group is None:
            return
        f = self.f
        up = GaugeMetricFamily("sparkd_peer_up", "1 when the peer's sparkd answers.", labels=[*f.keys, "peer"])
        for peer in group.peers_json():
            f.add(up, 1.0 if peer["reachable"] else 0.0, peer["peer"])
        yield up


class Metrics:
    """The registry a scrape renders, plus the start-duration histogram the daemon observes."""

    def __init__(self, view: StatusView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = collector = SparkdCollector(view)
        self.registry.register(collector)
        # The daemon's own process_* (CPU, RSS, descriptors, start time), as every Prometheus client exports them.
        ProcessCollector(registry=self.registry)
        self.start_duration = Histogram("sparkd_start_duration_seconds", "From launch to ready.",
                                        labelnames=collector.f.keys, buckets=START_BUCKETS, registry=self.registry)
        self.start_duration.labels(*collector.f.values)  # exported from the start, at 0

    def families(self) -> _Families:
        """The node's identity labels now, for the collectors other parts register."""
        return self.collector.f

    def on_state(self, before: NodeState, after: NodeState, posted: Any) -> None:
        """A launch became ready (the acceptance gate included): how long it took, into the histogram."""
        was, now = before.machine, after.machine
        if came_up(was.state, now.state) and now.started_at is not None and now.launches:
            self.start_duration.labels(*self.families().values).observe(now.since - now.started_at)

    def render(self) -> bytes:
        return text_format(self.registry)


_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_ESCAPE_VALUE = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r'\"'})
_TYPES = {"counter": "counter", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
          "unknown": "untyped"}
_SUFFIXES = {"counter": "_total", "info": "_info"}


def text_format(registry: CollectorRegistry) -> bytes:
    """prometheus_client's ``generate_latest``, byte for byte, for families whose metric and label names are
    plain (sparkd's all are; anything else goes through ``generate_latest``): about a third of its cost, the
    scrape being rendered on the daemon's loop beside the memory guard."""
    out: list[str] = []
    for family in registry.collect():
        name = family.name + _SUFFIXES.get(family.type, "")
        if not _plain(name) or not all(_plain(s.name) and all(map(_plain, s.labels)) for s in family.samples):
            return generate_latest(registry)
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TYPES.get(family.type, family.type)}\n")
        later: dict[str, list[str]] = {}
        for sample in family.samples:
            line = _sample_line(sample)
            suffix = next((x for x in ("_created", "_gsum", "_gcount") if sample.name == family.name + x), None)
            if suffix is None:
                out.append(line)
            else:
                later.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(later.items()):
            out.append(f"# HELP {family.name}{suffix} {doc}\n# TYPE {family.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


@functools.lru_cache(maxsize=1024)
def _plain(name: str) -> bool:
    return _LEGACY_NAME.match(name) is not None


def _sample_line(sample: Any) -> str:
    labels = ",".join(f'{k}="{str(v).translate(_ESCAPE_VALUE)}"' for k, v in sorted(sample.labels.items()))
    stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
    return f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}{stamp}\n" if labels else \
        f"{sample.name} {floatToGoString(sample.value)}{stamp}\n"


class RecorderCollector:
    """The flight recorder's and the restart gate's metrics, with the node's identity labels."""

    def __init__(self, families: Callable[[], _Families], recorder: FlightRecorder, gate: StartGuard) -> None:
        self.families = families
        self.recorder = recorder
        self.gate = gate

    def collect(self) -> Iterator[Any]:
        f = self.families()
        written, dropped, syncs = self.recorder.counts()
        for name, doc, value in (
            ("sparkd_recorder_records", "Flight-recorder records written to the ring.", written),
            ("sparkd_recorder_dropped", "Flight-recorder records lost: the ring could not be written.", dropped),
            ("sparkd_recorder_syncs", "fdatasync calls on the flight recorder's ring.", syncs),
        ):
            family = f.counter(name, doc, [])
            f.add(family, value)
            yield family
        yield f.gauge("sparkd_reboot_needed", "1 when restarts kept losing memory that was never returned and "
                      "sparkd stopped restarting (reboot the node).", 1.0 if self.gate.verdict else 0.0)
        yield f.gauge("sparkd_memory_unreturned_bytes", "MemAvailable lost across the restarts the gate counted.",
                      self.gate.unreturned)
        if self.gate.baselines:
            yield f.gauge("sparkd_memory_baseline_bytes", "Settled MemAvailable before the last start, with "
                          "nothing of vLLM's running.", self.gate.baselines[-1].available)
