"""The wedge clock against real vLLM's behaviour, scripted: each step is one observation (a /health result, a canary
result, a metrics scrape, a vLLM log line) at its monotonic time, and the machine observation
it must emit.

What the scripts model (reviews/fidelity.md M1–M3; vLLM 0.13/0.24 source): the gauges and counters move only when
an engine step completes, so a wedge on an idle engine leaves them at 0; `--disable-log-stats` removes every
vllm:* family and the throughput line; the throughput line stops (DEBUG) once two intervals passed without tokens;
a gauge stays stale after the last request is aborted; the jit_monitor line follows each compile.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sparkd.config import HealthConfig
from sparkd.supervisor import health as h
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.health import HealthTracker, MetricsOff, ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.vocabulary import BecameReady, HealthDegraded, HealthFailed, HealthRecovered, Observation

CFG = HealthConfig(timeout_s=5, failure_threshold=3, canary_interval_s=15, canary_timeout_s=30, busy_grace_s=600,
                   stall_after_s=45, execute_timeout_s=1800)
STALL, HANG = FailureClass.stall, FailureClass.hang
OK, TIMEOUT = ProbeOutcome.ok, ProbeOutcome.timeout

JIT_LINE = ("(EngineCore) WARNING 05-18 19:12:27 [jit_monitor.py:103] Triton kernel JIT compilation during inference: "
            "_causal_conv1d_update_kernel. This causes a latency spike; consider extending warmup to cover this "
            "shape/config.")


def shm(seconds: int = 60) -> str:
    """The EngineCore's wait for a worker's answer to one step (vLLM 0.23/0.24, multiprocess executor)."""
    return (f"(EngineCore pid=222) INFO 08-15 11:16:19 [shm_broadcast.py:705] No available shared memory broadcast "
            f"block found in {seconds} seconds. This typically happens when some processes are hanging or doing some "
            f"time-consuming work (e.g. compilation, weight/kv cache quantization).")


def stats(prompt: float, gen: float, running: int, waiting: int = 0, kv: float = 0.7) -> str:
    """vLLM's periodic throughput line (0.21+ format, as logged by the API server)."""
    return (f"(APIServer pid=605) INFO 07-15 15:32:47 [loggers.py:273] Engine 000: Avg prompt throughput: {prompt:.1f} "
            f"tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} "
            f"reqs, GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%")


@dataclass(frozen=True)
class Step:
    kind: str  # health | canary | metrics | log
    value: object
    now: float
    expect: str | FailureClass | None = None
    latency: float = 0.01


def H(outcome: ProbeOutcome, now: float, expect: str | FailureClass | None = None) -> Step:
    return Step("health", outcome, now, expect)


def C(outcome: ProbeOutcome, now: float, expect: str | FailureClass | None = None) -> Step:
    """A canary result at `now`; a timeout was sent canary_timeout_s earlier."""
    return Step("canary", outcome, now, expect, latency=CFG.canary_timeout_s if outcome is TIMEOUT else 0.2)


def M(running: float, gen: float, now: float, expect: str | FailureClass | None = None, *, kv: float = 0.01,
      prompt: float = 500.0, waiting: float = 0.0) -> Step:
    metrics = VllmMetrics(num_requests_running=running, generation_tokens_total=gen, num_requests_waiting=waiting,
                          prompt_tokens_total=prompt, kv_cache_usage_perc=kv)
    return Step("metrics", metrics, now, expect)


def OFF(now: float, expect: str | FailureClass | None = None) -> Step:
    return Step("metrics", MetricsOff(), now, expect)


def L(line: str, now: float, expect: str | FailureClass | None = None) -> Step:
    return Step("log", line, now, expect)


def label(obs: Observation | None) -> str | FailureClass | None:
    if obs is None:
        return None
    if isinstance(obs, HealthFailed):
        return obs.failure.cls
    return {BecameReady: "ready", HealthDegraded: "degraded", HealthRecovered: "recovered"}[type(obs)]


def feed(t: HealthTracker, step: Step, cfg: HealthConfig) -> tuple[HealthTracker, Observation | None]:
    if step.kind == "metrics":
        return h.observe_metrics(t, step.value, step.now, cfg)  # type: ignore[arg-type]
    if step.kind == "log":
        return h.observe_log_line(t, str(step.value), step.now, cfg)
    assert isinstance(step.value, ProbeOutcome)
    result = ProbeResult(step.value, step.latency, f"detail of {step.value}")
    return (h.observe_health if step.kind == "health" else h.observe_canary)(t, result, step.now, cfg)


def replay(steps: list[Step], cfg: HealthConfig = CFG, start: HealthTracker | None = None,
           ) -> tuple[HealthTracker, list[Observation | None]]:
    t = start if start is not None else HealthTracker()
    emitted: list[Observation | None] = []
    for i, step in enumerate(steps):
        t, obs = feed(t, step, cfg)
        assert label(obs) == step.expect, f"step {i} ({step}): emitted {obs!r}"
        emitted.append(obs)
    return t, emitted


def scrapes(start: float, stop: float, running: float, gen: float, **kw: float) -> list[Step]:
    """Frozen gauges scraped every 5 s (the health interval), expecting nothing."""
    return [M(running, gen, start + 5 * i, **kw) for i in range(int((stop - start) // 5) + 1)]


READY = [H(OK, 0, "ready")]

HISTORIES: dict[str, list[Step]] = {
    # ---- mid-generation: gauges frozen at a running batch
    "requests running, counters frozen, a canary unanswered: stall at stall_after_s": [
        *READY, M(3, 100, 0), *scrapes(5, 40, 3, 100), C(TIMEOUT, 42, "degraded"), M(3, 100, 44),
        M(3, 100, 45, STALL),
    ],
    "frozen gauges without a canary timeout are not a stall (stale after an abort)": [
        *READY, *scrapes(0, 300, 1, 100),
    ],
    "stale gauges on an idle engine: the canary's answer is progress": [
        *READY, M(1, 100, 0), *scrapes(5, 40, 1, 100), C(OK, 40), *scrapes(45, 80, 1, 101), C(OK, 85),
        *scrapes(90, 130, 1, 102),
    ],
    "tokens moving restart the clock; a canary must time out again": [
        *READY, *[M(3, 100 + i, 5 * i) for i in range(9)], C(TIMEOUT, 42, "degraded"), M(3, 150, 45), M(3, 150, 89),
        C(TIMEOUT, 89), M(3, 150, 90, STALL),
    ],
    "a counter reset (the value drops) is a move": [
        *READY, *[M(3, 100 + i, 5 * i) for i in range(9)], C(TIMEOUT, 42, "degraded"), M(3, 5, 45), M(3, 5, 89),
        C(TIMEOUT, 89), M(3, 5, 90, STALL),
    ],
    "a failed scrape keeps what the clock knew": [
        *READY, M(3, 100, 0), C(TIMEOUT, 30, "degraded"), Step("metrics", None, 40), Step("metrics", None, 45, STALL),
    ],
    "nothing running ends the busy spell; an idle gap is no step": [
        *READY, M(3, 100, 0), M(3, 100, 5), C(TIMEOUT, 30, "degraded"), M(0, 110, 40), M(2, 110, 100), M(2, 110, 130),
        C(TIMEOUT, 140), M(2, 110, 144), M(2, 110, 145, STALL),
    ],
    "request gauges that move without a token are no progress (held canaries piling up, published live)": [
        *READY, M(1, 100, 0), C(TIMEOUT, 10, "degraded"), M(2, 100, 20), M(3, 100, 30), M(4, 100, 44),
        M(5, 100, 45, STALL),
    ],
    "requests admitted and aborted with their KV, no token: no progress, so the idle canary is a hang": [
        *READY, M(0, 100, 0, kv=0.01), C(TIMEOUT, 40, "degraded"), M(1, 100, 41, prompt=600, kv=0.05),
        M(0, 100, 42, HANG, prompt=600, kv=0.01),
    ],
    "KV moving with the same requests is a prefill chunk: progress": [
        *READY, M(1, 100, 0, kv=0.10), C(TIMEOUT, 40, "degraded"),
        *[M(1, 100, t, kv=0.10 + t / 1000) for t in range(41, 400, 20)],
    ],
    # ---- a wedge that begins on an idle engine (gauges stay at 0)
    "idle engine, canary unanswered, no step since it was sent: hang at the canary's timeout": [
        *READY, *scrapes(0, 40, 0, 100), C(TIMEOUT, 40, HANG),
    ],
    "idle engine, canary slow but its step completed: busy, no hang": [
        *READY, *scrapes(0, 20, 0, 100), M(1, 101, 25), M(0, 101, 30), C(TIMEOUT, 40, "degraded"),
        *scrapes(45, 200, 0, 101),
    ],
    "idle engine: a step a scrape sees just after the canary was sent may predate it, so it answers nothing": [
        *READY, M(0, 100, 0), M(0, 100, 15), M(0, 102, 20.5), C(TIMEOUT, 50, HANG),
    ],
    "idle engine: the first scrape is a baseline, no step, even when it comes after the canary was sent": [
        *READY, M(0, 100, 15), C(TIMEOUT, 40, HANG),
    ],
    "idle engine: the first scrape sees the canary running, then its abort; no step since it was sent": [
        *READY, M(1, 100, 15, prompt=501), C(TIMEOUT, 40, "degraded"), M(0, 100, 45, HANG, prompt=501),
    ],
    "idle engine, canary unanswered, but no scrape after it was sent: not judged yet": [
        *READY, M(0, 100, 0), C(TIMEOUT, 40, "degraded"), M(0, 100, 45, HANG),
    ],
    # ---- long steps that are not wedges
    "a 1M-token prefill: KV usage grows every chunk, no token for minutes, canaries time out": [
        *READY, *[M(1, 100, 10 * i, kv=0.01 * i) for i in range(3)],
        *[step for i in range(3, 60) for step in (M(1, 100, 10 * i, kv=0.01 * i),
                                                  *([C(TIMEOUT, 10 * i + 1, "degraded" if i == 3 else None)]
                                                    if i % 3 == 0 else []))],
    ],
    "chunks of 52 s: the limit follows the longest step (2 x 52 s), not stall_after_s": [
        *READY, M(1, 100, 0, kv=0.0), M(1, 100, 50, kv=0.01), M(1, 100, 102, kv=0.02), C(TIMEOUT, 110, "degraded"),
        M(1, 100, 150, kv=0.02), M(1, 100, 155, kv=0.03), C(TIMEOUT, 190), M(1, 100, 200, kv=0.03),
        M(1, 100, 260, kv=0.03), M(1, 100, 261, STALL, kv=0.03),
    ],
    # ---- JIT compiles hold the verdict for vLLM's execute timeout
    "a JIT line holds the stall until the execute timeout": [
        *READY, M(3, 100, 0), L(JIT_LINE, 10), C(TIMEOUT, 40, "degraded"), *scrapes(45, 1805, 3, 100),
        M(3, 100, 1810, STALL),
    ],
    "progress after the JIT ends the hold": [
        *READY, M(3, 100, 0), L(JIT_LINE, 10), C(TIMEOUT, 40, "degraded"), *scrapes(45, 295, 3, 100),
        M(3, 120, 300), C(TIMEOUT, 330, "degraded"), M(3, 120, 344), M(3, 120, 345, STALL),
    ],
    "a JIT line holds the idle-engine hang too": [
        *READY, *scrapes(0, 20, 0, 100), L(JIT_LINE, 25), *scrapes(25, 40, 0, 100), C(TIMEOUT, 40, "degraded"),
    ],
    # ---- metrics off (--disable-log-stats): blind, only the busy grace
    "metrics off: no degradation; canary timeouts are busy until busy_grace_s": [
        *READY, OFF(5), C(TIMEOUT, 40, "degraded"), OFF(45), C(TIMEOUT, 600), C(TIMEOUT, 640, HANG),
    ],
    # ---- metrics off, TP >= 2: the executor's wait line is the step signal left
    "metrics off: the executor's wait line while a canary is unanswered is a hang": [
        *READY, OFF(0), C(TIMEOUT, 40, "degraded"), OFF(45), L(shm(), 58, HANG),
    ],
    "metrics off: a wait line first, then the canary's timeout decides": [
        *READY, OFF(0), L(shm(), 35), C(TIMEOUT, 40, HANG),
    ],
    "metrics off: a wait line without an unanswered canary is not a wedge": [
        *READY, OFF(0), L(shm(), 35), OFF(40), L(shm(), 95),
    ],
    "metrics off: a canary answered ends the wait; the next one counts anew": [
        *READY, OFF(0), L(shm(), 30), C(OK, 40), C(TIMEOUT, 80, "degraded"), OFF(85), L(shm(), 140, HANG),
    ],
    "metrics off: a wait long over (no line since) is no evidence": [
        *READY, OFF(0), L(shm(), 10), C(TIMEOUT, 200, "degraded"), OFF(205), C(TIMEOUT, 230),
    ],
    "metrics off: lines of a shorter interval add up to stall_after_s": [
        *READY, OFF(0), C(TIMEOUT, 40, "degraded"), L(shm(20), 41), L(shm(20), 61), L(shm(20), 81, HANG),
    ],
    "metrics off: lines further apart than 1.5 intervals are separate steps (a long prefill)": [
        *READY, OFF(0), C(TIMEOUT, 40, "degraded"), L(shm(20), 41), L(shm(20), 72), L(shm(20), 103),
        L(shm(20), 134), C(TIMEOUT, 140),
    ],
    "metrics off: a JIT line holds the wait lines until vLLM's execute timeout": [
        *READY, OFF(0), L(JIT_LINE, 5), C(TIMEOUT, 40, "degraded"),
        *[L(shm(), 60 * k) for k in range(1, 31)], L(shm(), 1860, HANG),
    ],
    # ---- metrics off but throughput lines present: the fallback signal
    "throughput lines: tokens moving, then a last zero line and silence, canary unanswered: stall": [
        *READY, OFF(0), L(stats(500, 30, 2), 10), L(stats(0, 31, 2), 20), L(stats(0, 0, 2), 30), OFF(35),
        C(TIMEOUT, 50, "degraded"), OFF(60), OFF(64), OFF(65, STALL),
    ],
    "throughput lines: tokens keep moving, canary slow: busy only": [
        *READY, OFF(0), *[L(stats(0, 40, 4), 10 * i) for i in range(1, 30)], C(TIMEOUT, 45, "degraded"),
        *[OFF(5 * i) for i in range(10, 60)],
    ],
    "with metrics scraped, a throughput line's older tokens do not delay the stall": [
        *READY, M(3, 100, 0), C(TIMEOUT, 35, "degraded"), L(stats(0, 30, 3), 40), M(3, 100, 44), M(3, 100, 45, STALL),
    ],
    "a throughput line whose interval began before the JIT line does not end the hold": [
        *READY, OFF(0), L(stats(0, 30, 2), 5), L(JIT_LINE, 10), L(stats(0, 30, 2), 15), C(TIMEOUT, 50, "degraded"),
        *[OFF(5 * i) for i in range(11, 60)],
    ],
    "throughput lines: idle (last line Running: 0), canary unanswered, lines stay silent: hang": [
        *READY, OFF(0), L(stats(0, 20, 1), 10), L(stats(0, 3, 0), 20), OFF(30), C(TIMEOUT, 60, HANG),
    ],
}


@pytest.mark.parametrize("name", list(HISTORIES))
def test_history(name: str) -> None:
    """Each step emits exactly the expected observation (see the step's `expect`)."""
    replay(HISTORIES[name])


def test_canary_off_lets_frozen_gauges_alone_stall() -> None:
    """Without a canary nothing refreshes a stale gauge, so the gauges alone decide (the documented risk)."""
    no_canary = CFG.model_copy(update={"canary": False})
    replay([*READY, M(3, 100, 0), *scrapes(5, 40, 3, 100), M(3, 100, 45, STALL)], no_canary)


def test_execute_timeout_unset_means_vllms_default() -> None:
    """No execute_timeout_s: vLLM's own default (300 s) bounds the JIT hold."""
    cfg = CFG.model_copy(update={"execute_timeout_s": None})
    replay([*READY, M(3, 100, 0), L(JIT_LINE, 10), C(TIMEOUT, 40, "degraded"), *scrapes(45, 305, 3, 100),
            M(3, 100, 310, STALL)], cfg)


def test_canary_off_lets_the_wait_line_alone_decide_when_blind() -> None:
    replay([*READY, OFF(0), L(shm(), 60, HANG)], CFG.model_copy(update={"canary": False}))


def test_blind_hang_sentence_quotes_vllms_wait() -> None:
    _, emitted = replay([*READY, OFF(0), C(TIMEOUT, 40, "degraded"), L(shm(), 58, HANG)])
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed)
    assert obs.failure.sentence.startswith(
        "vLLM's executor has waited 60 s for a worker to finish one engine step (\"No available shared memory "
        "broadcast block found in 60 seconds\", 1 line), a test generation got no answer and no JIT compile within "
        "vLLM's execute timeout explains it while /health is 200; ")
    assert obs.failure.evidence is not None and "--disable-log-stats" in obs.failure.evidence


def test_stall_sentence_names_the_numbers() -> None:
    _, emitted = replay([*READY, M(3, 4096, 0, kv=0.25), C(TIMEOUT, 35, "degraded"), M(3, 4096, 45, STALL, kv=0.25)])
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed)
    assert obs.failure.sentence.startswith(
        "3 requests running and no engine step completed for 45 s (generation_tokens_total stuck at 4096, KV cache "
        "usage unchanged at 25.0%; stall limit 45 s) and a test generation got no answer while /health is 200; ")
    assert obs.failure.evidence is not None and "vllm:num_requests_running=3" in obs.failure.evidence


def test_idle_hang_sentence_says_why_the_gauges_are_zero() -> None:
    _, emitted = replay([*READY, *scrapes(0, 40, 0, 100), C(TIMEOUT, 40, HANG)])
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed)
    assert obs.failure.sentence.startswith(
        "the generation canary has had no answer for 30 s and vLLM completed no engine step since it was sent (its "
        "gauges stayed at 0 running, 0 waiting: they move only when a step completes): the engine is wedged while "
        "/health is 200; ")


@pytest.mark.parametrize(("clients", "words"), [
    (0, "the engine is wedged while idle (no client connection open on the API port) while /health is 200"),
    (3, "the engine is wedged with requests in flight (3 client connections waiting on the API port)"),
])
def test_idle_hang_sentence_tells_idle_from_requests_in_flight(clients: int, words: str) -> None:
    """The gauges freeze with the engine, so the requests that wait are counted where they wait: the API port."""
    start = h.observe_clients(HealthTracker(), clients)
    _, emitted = replay([*READY, *scrapes(0, 40, 0, 100), C(TIMEOUT, 40, HANG)], start=start)
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed) and words in obs.failure.sentence, obs
    assert "idle batch" not in obs.failure.sentence


@pytest.mark.parametrize(("topology", "words", "not_words"), [
    (h.Topology.single, "one engine, no peer and no NCCL", "tensor-parallel"),
    (h.Topology.local, "tensor-parallel workers are likely wedged (NCCL between this node's GPUs", "the peer"),
    (h.Topology.group, "the tensor-parallel pair is likely wedged (NCCL or the peer)", "no peer"),
])
def test_hang_sentence_names_only_the_parts_the_instance_has(topology: h.Topology, words: str,
                                                            not_words: str) -> None:
    start = HealthTracker(topology=topology)
    _, emitted = replay([*READY, *scrapes(0, 40, 0, 100), C(TIMEOUT, 40, HANG)], start=start)
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed) and words in obs.failure.sentence and not_words not in obs.failure.sentence


def test_metrics_off_is_a_watch_note_not_a_degradation() -> None:
    t, emitted = replay([*READY, OFF(5)])
    assert emitted[-1] is None and t.verdict is h.Verdict.healthy
    assert t.watch_note is not None and "--disable-log-stats" in t.watch_note
    t, _ = h.observe_metrics(t, VllmMetrics(num_requests_running=0, generation_tokens_total=1), 10, CFG)
    assert t.watch_note is None


def test_busy_note_names_what_turns_it_into_a_wedge() -> None:
    _, emitted = replay([*READY, M(1, 1, 0), C(TIMEOUT, 35, "degraded")])
    assert isinstance(emitted[-1], HealthDegraded)
    assert emitted[-1].reason.endswith("a wedge if no engine step completes meanwhile")
    _, emitted = replay([*READY, OFF(0), C(TIMEOUT, 35, "degraded")])
    assert isinstance(emitted[-1], HealthDegraded)
    assert emitted[-1].reason.endswith("a hang if vLLM's executor waits 45 s on one step, or if still busy after 600 s")


def test_other_log_lines_change_nothing() -> None:
    t, _ = replay(READY)
    same, obs = h.observe_log_line(t, "(APIServer pid=1) INFO:     127.0.0.1:39830 - \"GET /health HTTP/1.1\" 200 OK",
                                   5, CFG)
    assert same is t and obs is None


def test_a_startups_compile_lines_hold_nothing_once_serving() -> None:
    """vLLM compiles at startup ("Compiling a graph for compile range", "Dynamo bytecode transform time") and
    none of it is a compile during inference. Fed before the first /health 200, it must not hold the wedge
    verdicts — with metrics off nothing else would clear that hold."""
    startup = HealthTracker()
    for step in (L("(Worker_TP0 pid=2642) INFO 11-26 12:26:26 [backends.py:393] Compiling a graph for compile range "
                   "(1, 8192) takes 0.03 s", 0), L(JIT_LINE, 0.5), L(shm(), 0.8)):
        same, obs = feed(startup, step, CFG)
        assert same is startup and obs is None
    replay([*READY, OFF(1), C(TIMEOUT, 40, "degraded"), L(shm(), 60, HANG)])


def test_a_busy_note_says_when_a_compile_holds_the_verdict() -> None:
    """Why no wedge is called yet: a compile vLLM itself would wait out."""
    _, emitted = replay([*READY, M(3, 100, 0), L(JIT_LINE, 20), C(TIMEOUT, 40, "degraded")])
    note = emitted[-1]
    assert isinstance(note, HealthDegraded), note
    assert "a JIT compile is running (Triton kernel _causal_conv1d_update_kernel)" in note.reason, note
