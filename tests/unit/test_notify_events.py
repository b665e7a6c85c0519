"""What a change of state means to a person (sparkd.notify.events), each payload shape, the rate limiter and its
summary, and the retry schedule: pure tables, no clock, no I/O."""

from __future__ import annotations

import base64
import json

import pytest

from sparkd.config.notify import Severity
from sparkd.notify.events import Event, EventKind, Snapshot, events, guard_event, snapshot
from sparkd.notify.limits import HeldBack, RateLimiter, retry_delay
from sparkd.notify.shapes import payload, runbook_link
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import Machine, State

OOM = Failure.of(FailureClass.oom, "vLLM ran out of memory while loading weights; lower gpu_memory_utilization.")
REBOOT = Failure.of(FailureClass.reboot_needed, "reboot needed: 3 restarts lost 9.0 GiB that was never returned")


def snap(state: State, failure: Failure | None = None, *, reason: str | None = None, restart: str | None = None,
         answers: str | None = None) -> Snapshot:
    return Snapshot("spark-1", state, failure, reason, restart, 4242, answers)


def kinds(found: list[Event]) -> list[str]:
    return [e.kind.value for e in found]


def test_watching_is_said_once_the_adoption_is_over_with_what_was_found() -> None:
    assert events(None, snap(State.adopting)) == []
    (first,) = events(snap(State.adopting), snap(State.failed, OOM, reason="3 failures in 600 s"))
    assert first.kind is EventKind.watching and first.severity is Severity.info
    assert "sparkd started watching vLLM on spark-1" in first.text and "breaker is OPEN: 3 failures" in first.text
    (first,) = events(None, snap(State.ready))
    assert first.kind is EventKind.watching and "vLLM serves" in first.text


def test_a_new_failure_is_one_warning_with_its_class_sentence_and_anchor() -> None:
    (event,) = events(snap(State.ready), snap(State.stopping, OOM))
    assert (event.kind, event.severity, event.failure_class, event.anchor) == (
        EventKind.failure, Severity.warning, "oom", "oom")
    assert event.text == OOM.sentence and event.title == "vLLM on spark-1 failed: oom"
    # the same failure carried on through the stop and the backoff is not told again
    assert events(snap(State.stopping, OOM), snap(State.backoff, OOM)) == []
    # an equal failure that happened again is a new object: told again
    again = Failure.of(FailureClass.oom, OOM.sentence)
    assert kinds(events(snap(State.starting, OOM), snap(State.stopping, again))) == ["failure"]


def test_the_breaker_opening_is_one_critical_event_carrying_the_failure_that_opened_it() -> None:
    found = events(snap(State.preflight, None), snap(State.failed, OOM, reason="4 failures within 600 s"))
    (event,) = found
    assert (event.kind, event.severity, event.anchor) == (EventKind.breaker_open, Severity.critical,
                                                          "sparkdbreakeropen")
    assert "4 failures within 600 s" in event.text and OOM.sentence in event.text and "sparkctl reset" in event.text


def test_a_breaker_opened_by_the_restart_gate_says_reboot_needed() -> None:
    (event,) = events(snap(State.preflight), snap(State.failed, REBOOT, reason=REBOOT.sentence))
    assert (event.kind, event.severity, event.anchor) == (EventKind.reboot_needed, Severity.critical,
                                                          "sparkdrebootneeded")
    assert "Reboot the node" in event.text


def test_recovered_only_when_ready_again_after_a_failure() -> None:
    (event,) = events(snap(State.starting, OOM, restart="oom"), snap(State.ready, OOM, restart="oom"))
    assert (event.kind, event.severity) == (EventKind.recovered, Severity.info)
    assert event.text == "vLLM on spark-1 is ready again after an oom failure (pid 4242)."
    assert events(snap(State.starting, restart="operator"), snap(State.ready, restart="operator")) == []
    assert events(snap(State.starting), snap(State.ready)) == []  # the first start
    assert events(snap(State.degraded, restart="oom"), snap(State.ready, restart="oom")) == []


def test_a_wait_is_said_when_it_begins_not_at_each_try_while_it_lasts() -> None:
    """The guard's start gate, the Docker engine away, the peer gone: classes that spend no restart budget repeat
    at every backoff while the wait lasts (seen from a real daemon: five in five seconds of the guard's cool-down)."""
    first = Failure.of(FailureClass.host_unavailable, "The memory guard refuses a start: cool-down 0.5 s ago")
    again = Failure.of(FailureClass.host_unavailable, "The memory guard refuses a start: cool-down 1.6 s ago")
    guard = Failure.of(FailureClass.killed_by_guard, "sparkd's memory guard killed vLLM")
    assert kinds(events(snap(State.backoff, guard), snap(State.preflight, first))) == ["failure"]
    assert events(snap(State.preflight, first), snap(State.backoff, again)) == []
    oom_again = Failure.of(FailureClass.oom, OOM.sentence)
    assert kinds(events(snap(State.ready, OOM), snap(State.stopping, oom_again))) == ["failure"]  # not a wait


def test_recovered_names_the_failure_that_began_the_outage_when_the_caller_kept_it() -> None:
    ready = events(snap(State.starting, restart="host_unavailable"), snap(State.ready, restart="host_unavailable"),
                   cause="killed_by_guard")
    assert [(e.kind, e.failure_class) for e in ready] == [(EventKind.recovered, "killed_by_guard")]
    assert ready[0].text == "vLLM on spark-1 is ready again after a killed_by_guard failure (pid 4242)."


def test_answers_changed_is_critical_when_the_verdict_appears_or_changes() -> None:
    said = "the answer to prompt 2 differs at token 3"
    (event,) = events(snap(State.ready), snap(State.ready, answers=said))
    assert (event.kind, event.severity, event.text) == (EventKind.answers_changed, Severity.critical, said)
    assert events(snap(State.ready, answers=said), snap(State.ready, answers=said)) == []


def test_snapshot_reads_the_core_machine() -> None:
    m = Machine(state=State.failed, last_failure=OOM, breaker_reason="why", restart_reason="oom")
    assert snapshot("n", m, pid=7) == Snapshot("n", State.failed, OOM, "why", "oom", 7, None)


@pytest.mark.parametrize(("action", "severity", "anchor"), [
    ("stop", Severity.critical, "sparkdguardkilled"), ("kill", Severity.critical, "sparkdguardkilled"),
    ("planned_restart", Severity.warning, "sparkdmemoryleakpredicted"),
    ("refuse_start", Severity.warning, "sparkdguardrefusesstart"), ("warn", Severity.warning, "sparkdmemorylow"),
])
def test_guard_actions_are_told_with_their_reason(action: str, severity: Severity, anchor: str) -> None:
    event = guard_event("spark-1", action, "MemAvailable 1.2 GiB < stop floor 1.5 GiB")
    assert event is not None and (event.kind, event.severity, event.anchor) == (EventKind.guard, severity, anchor)
    assert event.text == "MemAvailable 1.2 GiB < stop floor 1.5 GiB"


def test_guard_ok_and_cooldown_are_not_told_and_a_dry_run_is_one_level_lower() -> None:
    assert guard_event("n", "ok", "fine") is None and guard_event("n", "cooldown", "waiting") is None
    event = guard_event("n", "kill", "low", dry_run=True)
    assert event is not None and event.severity is Severity.warning and "dry run" in event.title


# ---- the shapes


EVENT = Event(EventKind.breaker_open, Severity.critical, "spark-1", "vLLM on spark-1 gave up restarting — ✓",
              "The breaker is open <now> & stays", "oom", "sparkdbreakeropen", 1_800_000_000.0)
BASE = "http://10.0.0.1:9479/runbook"


def test_json_shape_is_the_event_with_its_runbook_link() -> None:
    body, headers = payload("json", EVENT, runbook_link(BASE, EVENT))
    data = json.loads(body)
    assert headers["Content-Type"] == "application/json"
    assert data["source"] == "sparkd" and data["kind"] == "breaker_open" and data["severity"] == "critical"
    assert data["runbook"] == f"{BASE}#sparkdbreakeropen" and data["class"] == "oom"
    assert data["at"] == "2027-01-15T08:00:00+00:00" and data["title"] == EVENT.title


def test_ntfy_shape_puts_title_priority_tags_and_click_in_headers() -> None:
    body, headers = payload("ntfy", EVENT, f"{BASE}#sparkdbreakeropen")
    assert body.decode() == EVENT.text
    assert headers["Priority"] == "5" and headers["Tags"] == "rotating_light,sparkd"
    assert headers["Click"] == f"{BASE}#sparkdbreakeropen"
    title = headers["Title"]  # not ASCII: an RFC 2047 encoded-word, every header latin-1 safe
    assert title.startswith("=?utf-8?b?") and base64.b64decode(title[10:-2]).decode() == EVENT.title
    assert all(v.encode("latin-1") for v in headers.values())
    plain = Event(EventKind.recovered, Severity.info, "n", "ok now", "text")
    _, headers = payload("ntfy", plain)
    assert headers["Title"] == "ok now" and headers["Priority"] == "3" and "Click" not in headers


def test_slack_shape_is_one_escaped_mrkdwn_text_with_the_link() -> None:
    body, _ = payload("slack", EVENT, f"{BASE}#sparkdbreakeropen")
    (text,) = json.loads(body).values()
    assert text.startswith(":rotating_light: *vLLM on spark-1 gave up restarting")
    assert "&lt;now&gt; &amp; stays" in text and text.endswith(f"<{BASE}#sparkdbreakeropen|What to do: the runbook>")


def test_no_link_without_a_base_or_an_anchor() -> None:
    assert runbook_link(None, EVENT) is None
    assert runbook_link(BASE, Event(EventKind.watching, Severity.info, "n", "t", "x")) is None


# ---- rate, summary, retry


def test_the_bucket_gives_a_burst_then_per_hour() -> None:
    bucket = RateLimiter(burst=3, per_hour=60)  # one a minute after the burst
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.next_at(100.0) == pytest.approx(160.0)
    assert not bucket.take(159.0) and bucket.take(160.0) and not bucket.take(160.0)
    assert bucket.take(160.0 + 3 * 60) and bucket.take(160.0 + 3 * 60) and bucket.take(160.0 + 3 * 60)
    assert not bucket.take(160.0 + 3 * 60)  # refilled to the burst, not past it


def test_the_summary_counts_what_was_held_back_and_keeps_the_worst() -> None:
    held = HeldBack()
    assert not held
    for event in (Event(EventKind.failure, Severity.warning, "n", "f1", "t", "oom"),
                  Event(EventKind.failure, Severity.warning, "n", "f2", "t", "oom"),
                  Event(EventKind.breaker_open, Severity.critical, "n", "gave up", "breaker text", "nccl"),
                  Event(EventKind.recovered, Severity.info, "n", "ok", "t")):
        held.add(event)
    summary = held.summary("spark-1", 20)
    assert not held and summary.kind is EventKind.held_back and summary.severity is Severity.critical
    assert summary.counts == {"failure oom": 2, "breaker_open nccl": 1, "recovered": 1}
    assert summary.text.startswith("4 notifications from spark-1 were held back by the rate limit")
    assert "2 failure oom, 1 breaker_open nccl, 1 recovered" in summary.text and "gave up: breaker text" in summary.text


def test_retries_back_off_from_two_seconds_to_the_cap() -> None:
    assert [retry_delay(n, 60) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    assert retry_delay(10_000, 300) == 300
