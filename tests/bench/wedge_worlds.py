"""Simulated vLLM engines for bench_wedge.py: what sparkd's probes would see, on a simulated clock.

Each world follows real vLLM's rules (reviews/fidelity.md, vLLM 0.13/0.24 source): the ``vllm:*`` gauges and
counters change only when an engine step completes; prompt tokens are counted when a prefill finishes; the
throughput line comes every 10 s and only while tokens moved in this or the last interval; ``--disable-log-stats``
removes both but not the EngineCore's wait line, which a multiprocess executor (TP >= 2) writes every 60 s of a
step that does not complete; a canary is answered when its step completes, and cannot be scheduled while a long
prefill holds the token budget. Each engine step is also a span (began, ended, tokens): what sparkd's step probe
records in every rank (wedge_probe.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

KV_POOL_TOKENS = 1_901_239  # field report 004: "GPU KV cache size: 1,901,239 tokens"
# Per-token prefill time at context x: a + b·x seconds, fitted to field report 001's TTFTs (240K in 2.4 min, 980K
# in 16.6 min on 2x GB10): a = 4.435e-4, b = 1.165e-9.
PREFILL_A, PREFILL_B = 4.435e-4, 1.165e-9

Marks = tuple[float, float, float, int, int]  # generation, prompt, kv usage (0..1), running, waiting


@dataclass
class World:
    """Engine steps as (completion time, marks after it); a canary gets its answer when its step completes."""

    steps: list[tuple[float, Marks]] = field(default_factory=list)
    metrics: bool = True  # vllm:* families on /metrics
    log_stats: bool = True  # the periodic throughput line
    stuck_after: float = math.inf  # no step completes from here on (a wedge)
    resume_at: float = math.inf  # ... until here (a JIT pause ends)
    busy_from: float = math.inf  # a canary sent in [busy_from, busy_until) waits for the token budget
    busy_until: float = -math.inf  # (a long prefill holds it)
    lines: list[tuple[float, str]] = field(default_factory=list)  # other log lines (JIT)
    waits: bool = False  # TP >= 2: the EngineCore logs SHM_LINE every 60 s while one step does not complete
    spans: list[tuple[float, float, int]] = field(default_factory=list)  # each step: began, ended (inf: never), tokens
    _times: list[float] = field(default_factory=list)
    _stuck_canaries: list[float] = field(default_factory=list)  # the sends of canaries whose step never completed

    def freeze(self) -> World:
        self.steps.sort(key=lambda s: s[0])
        self._times = [t for t, _ in self.steps]
        return self

    def marks(self, t: float) -> Marks:
        i = bisect.bisect_right(self._times, t) - 1
        return self.steps[i][1] if i >= 0 else (0.0, 0.0, 0.0, 0, 0)

    def completes(self, t: float) -> bool:
        return not (self.stuck_after <= t < self.resume_at)

    def canary(self, sent: float, timeout: float) -> float | None:
        """The canary's latency, or None when it gets no answer within `timeout` (then vLLM aborts it)."""
        start = max(sent, self.busy_until) if self.busy_from <= sent else sent
        done = start + 0.2
        if not (self.completes(start) and self.completes(done)) and done < self.resume_at:
            done = self.resume_at + 0.2 if self.resume_at < math.inf else math.inf
        in_step = bool(self.spans) and self.spans[-1][0] <= start < self.spans[-1][1]
        if self.marks(start)[3] == 0 and not in_step:  # an idle engine runs the canary's step (the probe sees it)
            self.add_span(start, done, 8)
        if done - sent > timeout:
            if done == math.inf and not self._stuck_canaries and self.marks(start)[3] == 0:
                self._stuck_canaries.append(start)  # an idle engine's first stuck step: this canary's
            return None
        self.add_step(done, 1, 8)
        return done - sent

    def wait_lines(self, until: float) -> list[tuple[float, str]]:
        """The executor's wait lines up to `until`: every 60 s of a step that does not complete, from the step's start
        (the previous completion while requests run, or a canary's arrival on an idle engine)."""
        if not self.waits:
            return []
        ends = [*self._times[1:], math.inf]
        starts = [(t, end) for (t, marks), end in zip(self.steps, ends, strict=True)
                  if marks[3] > 0 and end - t > WAIT_INTERVAL_S]
        starts += [(t, math.inf) for t in self._stuck_canaries]
        return sorted((t + k * WAIT_INTERVAL_S, SHM_LINE) for t, end in starts
                      for k in range(1, int((min(end, until) - t) // WAIT_INTERVAL_S) + 1)
                      if t + k * WAIT_INTERVAL_S < end)

    def add_span(self, began: float, ended: float, tokens: int) -> None:
        bisect.insort(self.spans, (began, ended, tokens))

    def add_step(self, t: float, gen: int, prompt: int) -> None:
        g, p, kv, r, w = self.marks(t)
        self.steps.append((t, (g + gen, p + prompt, kv, r, w)))
        self.freeze()

    def throughput_lines(self, until: float, phase: float) -> list[tuple[float, str]]:
        """vLLM's LoggingStatLogger: every 10 s, INFO only unless this and the last interval moved no token."""
        if not self.log_stats:
            return []
        out, last = [], (0.0, 0.0)
        t, prev = phase, self.marks(phase - 10)
        while t <= until:
            now = self.marks(t)
            rates = ((now[1] - prev[1]) / 10, (now[0] - prev[0]) / 10)
            if any(rates) or any(last):
                out.append((t, (f"(APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:273] Engine 000: Avg prompt "
                                f"throughput: {rates[0]:.1f} tokens/s, Avg generation throughput: {rates[1]:.1f} "
                                f"tokens/s, Running: {now[3]} reqs, Waiting: {now[4]} reqs, GPU KV cache usage: "
                                f"{now[2] * 100:.1f}%, Prefix cache hit rate: 0.0%")))
            last, prev, t = rates, now, t + 10
        return out


JIT_LINE = ("(Worker_TP0 pid=2) WARNING 01-01 00:00:00 [jit_monitor.py:103] Triton kernel JIT compilation during "
            "inference: _causal_conv1d_update_kernel. This causes a latency spike; consider extending warmup to "
            "cover this shape/config.")
WAIT_INTERVAL_S = 60  # VLLM_RINGBUFFER_WARNING_INTERVAL
SHM_LINE = ("(EngineCore pid=1) INFO 01-01 00:00:00 [shm_broadcast.py:705] No available shared memory broadcast "
            "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
            "time-consuming work (e.g. compilation, weight/kv cache quantization).")


def decoding(until: float, running: int = 3, stuck_after: float = math.inf, resume_at: float = math.inf,
             step_s: float = 0.05) -> World:
    """`running` requests decoding one token per step; no step completes in [stuck_after, resume_at)."""
    world = World(stuck_after=stuck_after, resume_at=resume_at)
    t, gen, kv = 0.0, 0.0, 0.05
    while t < until:
        t += step_s
        if not world.completes(t):
            world.spans.append((t - step_s, resume_at, running))  # the step that hangs (until the pause ends)
            t = resume_at
            continue
        gen += running
        kv += running / KV_POOL_TOKENS
        world.steps.append((t, (gen, 4096.0, kv, running, 0)))
        world.spans.append((t - step_s, t, running))
    return world.freeze()


def idle(stuck_after: float = math.inf) -> World:
    """An idle engine (gauges at 0) that stops completing steps at `stuck_after`."""
    return World(steps=[(0.0, (100.0, 800.0, 0.0, 0, 0))], stuck_after=stuck_after).freeze()


def prefill(prompt_tokens: int, chunk: int, start: float = 0.0) -> World:
    """One long prompt, chunked: KV usage grows per chunk, no token and no prompt count until the prefill ends;
    the chunks take the whole token budget, so a canary waits until it is done."""
    world = World()
    world.steps.append((0.0, (100.0, 800.0, 0.0, 0, 0)))
    t, done = start, 0
    while done < prompt_tokens:
        n = min(chunk, prompt_tokens - done)
        began = t
        t += n * PREFILL_A + PREFILL_B * ((done + n) ** 2 - done**2) / 2
        done += n
        world.steps.append((t, (100.0, 800.0, done / KV_POOL_TOKENS, 1, 0)))
        world.spans.append((began, t, n))
    world.steps.append((t + 0.05, (101.0, 800.0 + prompt_tokens, done / KV_POOL_TOKENS, 1, 0)))
    world.spans.append((t, t + 0.05, 1))
    world.busy_from, world.busy_until = start, t
    return world.freeze()
