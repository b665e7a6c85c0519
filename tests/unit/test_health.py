"""The health tracker, scripted: sequences of (probe, result, time) → the machine observation each emits.

No clock, no sleep: every step carries its monotonic time. The wedge clock (stall and idle-engine hang from
metrics, canary, log lines and compiles) has its own tables in test_wedge.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sparkd.config import HealthConfig
from sparkd.supervisor import health as h
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.health import HealthTracker, ProbeOutcome, ProbeResult, Verdict, VllmMetrics
from sparkd.supervisor.vocabulary import BecameReady, HealthDegraded, HealthFailed, HealthRecovered, Observation

CFG = HealthConfig(
    timeout_s=5, failure_threshold=3, success_threshold=2, canary_timeout_s=30, busy_grace_s=600, stall_after_s=120
)

OK, DEAD, REFUSED, TIMEOUT, ERROR = (
    ProbeOutcome.ok,
    ProbeOutcome.engine_dead,
    ProbeOutcome.refused,
    ProbeOutcome.timeout,
    ProbeOutcome.error,
)


@dataclass(frozen=True)
class Step:
    probe: h.ProbeName
    value: ProbeOutcome | VllmMetrics | None
    now: float
    expect: str | FailureClass | None  # "ready" | "degraded" | "recovered" | the failed class | None


def H(outcome: ProbeOutcome, now: float, expect: str | FailureClass | None = None) -> Step:
    return Step("health", outcome, now, expect)


def C(outcome: ProbeOutcome, now: float, expect: str | FailureClass | None = None) -> Step:
    return Step("canary", outcome, now, expect)


def M(
    running: float | None,
    tokens: float = 0.0,
    now: float = 0.0,
    expect: str | FailureClass | None = None,
    kv: float | None = None,
) -> Step:
    metrics = (
        None
        if running is None
        else VllmMetrics(num_requests_running=running, generation_tokens_total=tokens, kv_cache_usage_perc=kv)
    )
    return Step("metrics", metrics, now, expect)


def label(obs: Observation | None) -> str | FailureClass | None:
    if obs is None:
        return None
    if isinstance(obs, HealthFailed):
        return obs.failure.cls
    return {BecameReady: "ready", HealthDegraded: "degraded", HealthRecovered: "recovered"}[type(obs)]


def feed(t: HealthTracker, step: Step, cfg: HealthConfig = CFG) -> tuple[HealthTracker, Observation | None]:
    if step.probe == "metrics":
        assert not isinstance(step.value, ProbeOutcome)
        return h.observe_metrics(t, step.value, step.now, cfg)
    assert isinstance(step.value, ProbeOutcome)
    result = ProbeResult(step.value, 0.01, f"detail of {step.value}")
    observe = h.observe_health if step.probe == "health" else h.observe_canary
    return observe(t, result, step.now, cfg)


def replay(steps: list[Step], cfg: HealthConfig = CFG) -> tuple[HealthTracker, list[Observation | None]]:
    t = HealthTracker()
    emitted: list[Observation | None] = []
    for i, step in enumerate(steps):
        t, obs = feed(t, step, cfg)
        assert label(obs) == step.expect, f"step {i} ({step}): emitted {obs!r}"
        emitted.append(obs)
    return t, emitted


READY = [H(OK, 0, "ready")]

HISTORIES: dict[str, list[Step]] = {
    # ---- starting
    "refusals, timeouts and errors while starting are ignored; the first 200 is ready": [
        H(REFUSED, 0),
        H(REFUSED, 5),
        H(TIMEOUT, 10),
        H(ERROR, 15),
        H(REFUSED, 20),
        H(OK, 25, "ready"),
    ],
    "503 counts while starting: the server is up and the engine dead": [
        H(REFUSED, 0),
        H(DEAD, 5),
        H(DEAD, 10),
        H(DEAD, 15, FailureClass.engine_dead),
    ],
    "canary and metrics before ready are ignored": [
        C(TIMEOUT, 0),
        C(DEAD, 1),
        M(3, 100, 2),
        M(3, 100, 500),
        H(OK, 501, "ready"),
    ],
    # ---- /health failure threshold
    "timeouts degrade, then fail as a hang at the threshold": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(TIMEOUT, 10, "degraded"),
        H(TIMEOUT, 15, FailureClass.hang),
    ],
    "503s fail as engine_dead": [
        *READY,
        H(DEAD, 5, "degraded"),
        H(DEAD, 10, "degraded"),
        H(DEAD, 15, FailureClass.engine_dead),
    ],
    "refusals fail as engine_dead (the API server is gone)": [
        *READY,
        H(REFUSED, 5, "degraded"),
        H(REFUSED, 10, "degraded"),
        H(REFUSED, 15, FailureClass.engine_dead),
    ],
    "a 503 anywhere in the streak makes it engine_dead": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(DEAD, 10, "degraded"),
        H(TIMEOUT, 15, FailureClass.engine_dead),
    ],
    "a streak that ends refused is engine_dead": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(TIMEOUT, 10, "degraded"),
        H(REFUSED, 15, FailureClass.engine_dead),
    ],
    "a 200 breaks the streak": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(TIMEOUT, 10, "degraded"),
        H(OK, 15),
        H(TIMEOUT, 20, "degraded"),
        H(TIMEOUT, 25, "degraded"),
        H(OK, 30),
        H(OK, 35, "recovered"),
    ],
    "success_threshold 200s in a row recover": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(OK, 10),
        H(OK, 15, "recovered"),
        H(OK, 20),
    ],
    "on hold after failing: nothing more is emitted": [
        *READY,
        H(DEAD, 5, "degraded"),
        H(DEAD, 10, "degraded"),
        H(DEAD, 15, FailureClass.engine_dead),
        H(OK, 20),
        H(OK, 25),
        C(DEAD, 26),
        M(3, 1, 27),
        M(3, 1, 1000),
    ],
    # ---- probe errors
    "errors degrade but never fail on their own": [
        *READY,
        H(ERROR, 5, "degraded"),
        *[H(ERROR, 10 + i) for i in range(10)],
        H(OK, 30),
        H(OK, 35, "recovered"),
    ],
    "errors neither add to nor break a failure streak": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(ERROR, 10),
        H(TIMEOUT, 15, "degraded"),
        H(ERROR, 20),
        H(TIMEOUT, 25, FailureClass.hang),
    ],
    "two failures and errors after them never fail": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        H(TIMEOUT, 10, "degraded"),
        *[H(ERROR, 15 + i) for i in range(5)],
    ],
    # ---- canary and busy grace
    "a canary timeout while /health is 200 is busy; a hang after the busy grace": [
        *READY,
        C(TIMEOUT, 100, "degraded"),
        H(OK, 105),
        C(TIMEOUT, 400),
        C(TIMEOUT, 699),
        C(TIMEOUT, 700, FailureClass.hang),
    ],
    "a canary 200 clears busy": [
        *READY,
        C(TIMEOUT, 100, "degraded"),
        C(OK, 200, "recovered"),
        C(TIMEOUT, 300, "degraded"),
        C(TIMEOUT, 850),
        C(OK, 899, "recovered"),
        C(TIMEOUT, 1000, "degraded"),
    ],
    "a canary timeout while /health is failing is left to /health": [
        *READY,
        H(TIMEOUT, 5, "degraded"),
        C(TIMEOUT, 6),
        C(TIMEOUT, 700),
        H(OK, 705),
        H(OK, 710, "recovered"),
    ],
    "a canary engine_dead fails at once": [*READY, C(DEAD, 60, FailureClass.engine_dead)],
    "a canary error degrades until a canary 200": [
        *READY,
        C(ERROR, 60, "degraded"),
        C(ERROR, 120),
        C(OK, 180, "recovered"),
    ],
    "a refused canary is left to /health": [*READY, C(REFUSED, 60)],
    "/health degradation takes precedence over busy, then busy shows again": [
        *READY,
        C(TIMEOUT, 60, "degraded"),
        H(TIMEOUT, 65, "degraded"),
        H(OK, 70),
        H(OK, 75, "degraded"),
        C(OK, 120, "recovered"),
    ],
    "idle with frozen tokens is fine": [*READY, *[M(0, 100, 10 + 100 * i) for i in range(10)]],
}


@pytest.mark.parametrize("name", list(HISTORIES))
def test_history(name: str) -> None:
    """Each step emits exactly the expected observation (see the step's `expect`)."""
    replay(HISTORIES[name])


def test_failure_threshold_one_fails_on_the_first_failure() -> None:
    """With failure_threshold 1 there is no degraded step."""
    cfg = CFG.model_copy(update={"failure_threshold": 1})
    replay([*READY, H(TIMEOUT, 5, FailureClass.hang)], cfg)


def test_busy_grace_zero_fails_on_the_first_busy_canary() -> None:
    cfg = CFG.model_copy(update={"busy_grace_s": 0})
    replay([*READY, C(TIMEOUT, 60, FailureClass.hang)], cfg)


def test_degraded_reason_counts_failures() -> None:
    """The reason names what /health did and how far the streak is."""
    _, emitted = replay([*READY, H(TIMEOUT, 5, "degraded"), H(DEAD, 10, "degraded")])
    assert emitted[1] == HealthDegraded("/health got no answer within 5 s (1 of 3 failures in a row)")
    assert emitted[2] == HealthDegraded("/health answered 503 (2 of 3 failures in a row)")


def test_error_reason_carries_the_detail() -> None:
    _, emitted = replay([*READY, H(ERROR, 5, "degraded")])
    assert emitted[1] == HealthDegraded("/health probe error: detail of error")


def test_busy_reason() -> None:
    _, emitted = replay([*READY, C(TIMEOUT, 60, "degraded")])
    assert isinstance(emitted[1], HealthDegraded)
    assert emitted[1].reason.startswith("busy: the generation canary got no answer within 30 s while /health")


def test_503_failure_sentence() -> None:
    t, emitted = replay(
        [*READY, H(DEAD, 5, "degraded"), H(DEAD, 10, "degraded"), H(DEAD, 15, FailureClass.engine_dead)]
    )
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed)
    failure = obs.failure
    assert failure.sentence.startswith("/health answered 503 (3 failures in a row): the engine core is dead")
    assert failure.sentence.endswith(".")
    assert (failure.exit_code, failure.signal) == (None, None)
    assert failure.evidence == "/health results: engine_dead, engine_dead, engine_dead; last: detail of engine_dead"
    assert t.failure == failure and t.verdict is Verdict.failed


def test_hang_sentence_names_the_busy_time() -> None:
    _, emitted = replay([*READY, C(TIMEOUT, 100, "degraded"), C(TIMEOUT, 760, FailureClass.hang)])
    obs = emitted[-1]
    assert isinstance(obs, HealthFailed)
    assert obs.failure.sentence.startswith(
        "the generation canary has had no answer for 660 s while /health is 200 (busy grace 600 s)"
    )


def test_counters() -> None:
    """Probes are counted by (probe, outcome), errors apart from failures, with the last latency."""
    t, _ = replay(
        [
            H(REFUSED, 0),
            H(OK, 1, "ready"),
            H(TIMEOUT, 5, "degraded"),
            H(ERROR, 10),
            C(OK, 11),
            M(None, 0, 12),
            M(0, 1, 13),
        ]
    )
    assert t.probes_total == {
        ("health", "refused"): 1,
        ("health", "ok"): 1,
        ("health", "timeout"): 1,
        ("health", "error"): 1,
        ("canary", "ok"): 1,
        ("metrics", "error"): 1,
        ("metrics", "ok"): 1,
    }
    assert t.errors_total("health") == 1 and t.errors_total("metrics") == 1 and t.errors_total("canary") == 0
    assert (t.consecutive_failures, t.consecutive_errors, t.consecutive_successes) == (1, 1, 0)
    assert t.last_latency_s == {"health": 0.01, "canary": 0.01}


def test_latency_is_the_last_one_per_probe() -> None:
    t, _ = h.observe_health(HealthTracker(), ProbeResult(OK, 0.5), 0, CFG)
    t, _ = h.observe_health(t, ProbeResult(OK, 0.25), 5, CFG)
    assert t.last_latency_s["health"] == 0.25


def test_tracker_is_not_mutated() -> None:
    """observe_* return a new tracker; the old one and its counters stay as they were."""
    t0 = HealthTracker()
    t1, _ = h.observe_health(t0, ProbeResult(OK, 0.1), 0, CFG)
    assert t0.probes_total == {} and t0.verdict is Verdict.starting
    assert t1.probes_total == {("health", "ok"): 1} and t1.verdict is Verdict.healthy
