"""The safety net that needs no rule (issue 25 §3): the same failure twice in a row before ready stops, quoting it;
and one launch at a time (§4): an incident keeps its own attempt's lines, and `sparkd explain` on it says what the
daemon said."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import anyio
import pytest
from loop_harness import config, running

from sparkd.cli.explain import explain
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.policy import GiveUp, Restart, RestartPolicy, RestartState, on_failure, on_ready
from sparkd.supervisor.repeat import comparable, signature
from sparkd.testing import FakeClock, FakeRuntime

F = FailureClass
NEW_ERROR = "(EngineCore pid=4100) ERROR 11-27 09:01:02 [core.py:1100] FrobnicatorError: widget 7 is sideways"
SAME_LATER = "(EngineCore pid=5200) ERROR 11-27 09:03:44 [core.py:1100] FrobnicatorError: widget 9 is sideways"
OTHER = "(EngineCore pid=5200) ERROR 11-27 09:03:44 [core.py:1100] FrobnicatorError: the gizmo is upside down"
POLICY = RestartPolicy(budget_failures=50, consecutive_limit=None)


def test_signature_ignores_what_changes_between_launches() -> None:
    assert signature(NEW_ERROR.split(") ", 1)[1]) == signature(SAME_LATER.split(") ", 1)[1])
    assert signature("x 0x7f3a9c at /tmp/vllm_dist_c44a9c61764b47a2") == signature("x 0x11 at /tmp/vllm_dist_9e0")
    assert signature(OTHER) != signature(NEW_ERROR)
    assert signature(None) is None and signature("  ") is None


def _fail(state: RestartState, evidence: str | None, t: float) -> tuple[RestartState, object]:
    return on_failure(state, POLICY, F.unknown, t, 0.5, evidence)


def test_the_same_unrecognised_failure_twice_before_ready_gives_up_quoting_it() -> None:
    state, first = _fail(RestartState(), NEW_ERROR, 0.0)
    assert isinstance(first, Restart)
    state, second = _fail(state, SAME_LATER, 30.0)
    assert isinstance(second, GiveUp), second
    assert "the same failure twice in a row before vLLM was ready" in second.reason
    assert "FrobnicatorError: widget 9 is sideways" in second.reason and "sparkctl reset" in second.reason


def test_a_different_failure_a_ready_run_or_no_evidence_in_between_does_not() -> None:
    state, _ = _fail(RestartState(), NEW_ERROR, 0.0)
    _, other = _fail(state, OTHER, 30.0)
    assert isinstance(other, Restart)
    ready = on_ready(state, 20.0)
    _, after_ready = _fail(ready, SAME_LATER, 30.0)
    assert isinstance(after_ready, Restart)
    state, _ = _fail(RestartState(), None, 0.0)
    _, blind = _fail(state, None, 30.0)
    assert isinstance(blind, Restart)


def test_outside_kills_and_rendezvous_waits_are_never_compared() -> None:
    kill = Failure(F.unknown, "killed", None, int(signal.SIGKILL), "ERROR x")
    rendezvous = Failure(F.rendezvous_timeout, "waited", 1, None, "Timed out after 600 seconds waiting for clients")
    crash = Failure(F.unknown, "segv", None, int(signal.SIGSEGV), "ERROR x")
    assert comparable(kill) is None and comparable(rendezvous) is None and comparable(crash) == "ERROR x"


@pytest.mark.anyio
async def test_the_daemon_stops_a_repeat_and_each_incident_explains_as_itself(tmp_path: Path) -> None:
    cfg = config(tmp_path, restart={"budget_failures": 50, "backoff_initial_s": 1})
    runtime, clock = FakeRuntime(auto_ready=False), FakeClock()
    async with running(cfg, runtime, clock) as node:
        await node.until_state("starting")
        runtime.say("INFO 11-27 09:00:00 [core.py:1] an earlier launch's line", NEW_ERROR)
        runtime.crash(1)
        await node.until(lambda: node.state == "starting" and len(runtime.launches) == 2)
        runtime.say(SAME_LATER)
        runtime.crash(1)
        await node.until_state("failed")
        await node.settled()
        assert "the same failure twice in a row before vLLM was ready (unknown)" in node.status()["breaker"]["reason"]
    folders = sorted((tmp_path / "state" / "incidents").iterdir())
    assert len(folders) == 2
    for folder in folders:
        record = json.loads((folder / "incident.json").read_text())
        tail = (folder / "log-tail.txt").read_text().splitlines()
        assert tail[0].startswith("---- sparkd: launch ") and sum(line.startswith("---- sparkd: launch ")
                                                                   for line in tail) == 1
        assert explain(tail).cls.value == record["class"]
    assert "an earlier launch's line" not in (folders[1] / "log-tail.txt").read_text()
    await anyio.sleep(0)
