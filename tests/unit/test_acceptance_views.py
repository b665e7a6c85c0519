"""What the acceptance gate looks like from outside (issue 37): `sparkctl status`'s lines, `sparkctl restart --wait`
ending on a refusal or a warning, systemd's STATUS= line, the standing kept by the node's state, the wake line, the
start's timing with the gate's seconds."""

from __future__ import annotations

from dataclasses import replace

from sparkd.cli.progress import live_text, outcome
from sparkd.commands import status as status_command
from sparkd.commands.accept import status_lines
from sparkd.config import config_from_mapping
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.views.status import status_line
from sparkd.supervisor.acceptance.gate import Part, PartResult, Progress, decide
from sparkd.supervisor.acceptance.replay import woke
from sparkd.supervisor.acceptance.standing import HISTORY, GateKind, Standing
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.states import Machine, State
from sparkd.supervisor.timing import LaunchTiming

PASS = decide([PartResult(Part.fingerprint, True, "6 answers match the golden exactly.")], started_at=0.0, now=1.5)
CHANGED = decide([PartResult(Part.fingerprint, False, "The answer differs")], started_at=0.0, now=2.0)


def test_sparkctl_status_says_the_run_the_verdict_and_the_history() -> None:
    assert status_lines({}) == []
    assert status_lines({"running": {"kind": "start", "line": "fingerprint, 2 of 3 parts, 4 s"}}) == [
        "  acceptance gate (start): fingerprint, 2 of 3 parts, 4 s"]
    refused = {"verdict": "answers_changed", "refused": True, "kind": "start", "sentence": "The answer differs — …",
               "history": [{"kind": "start", "verdict": "pass"}, {"kind": "start", "verdict": "answers_changed"}]}
    assert status_lines(refused) == ["  acceptance gate REFUSED ready (answers_changed): The answer differs — …",
                                     "  acceptance history: start pass, start answers_changed"]
    warned = {"verdict": "capacity_lost", "refused": False, "kind": "replay", "sentence": "fewer tokens"}
    assert status_lines(warned) == ["  acceptance gate: capacity_lost (replay): fewer tokens"]
    assert status_lines({"verdict": "pass", "kind": "start", "seconds": 1.24}) == [
        "  acceptance gate: pass (start, 1.2 s)"]
    shown = status_command.render({"node": "n", "role": "single", "runtime": "process", "state": "accepting",
                                   "restarts": 0, "acceptance": refused})  # type: ignore[typeddict-item]
    assert "acceptance gate REFUSED ready (answers_changed)" in shown


def test_restart_wait_ends_on_a_refusal_or_a_warning_and_says_the_gates_progress() -> None:
    held = {"state": "accepting", "launches": 2, "acceptance": {"refused": True}}
    assert outcome("ready", held, 1) == status_command.EXIT_UNHEALTHY
    assert outcome("ready", {**held, "acceptance": {"refused": False}}, 1) is None
    assert outcome("ready", {"state": "degraded", "launches": 2}, 1) == status_command.EXIT_UNHEALTHY
    assert outcome("ready", {"state": "degraded", "launches": 1}, 1) is None, "not this launch's yet"
    asking = {"state": "accepting", "acceptance": {"running": {"line": "garble, 3 of 3 parts, 2 s"}}}
    assert live_text("ready", asking, 5.0).startswith("accepting: the acceptance gate, garble, 3 of 3 parts, 2 s")


def test_systemds_status_line_says_the_gate() -> None:
    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "/m"}}, source="test")
    state = NodeState.boot(replace(Machine(), state=State.accepting), cfg)
    state = replace(state, instance=Instance(runtime="process", pid=7, create_time=1.0, config_hash="h"))
    assert status_line(state, 0.0) == "accepting: the acceptance gate asks, pid 7, restarts 0"
    held = replace(state, acceptance=Standing().took(CHANGED, GateKind.start))
    assert status_line(held, 0.0) == "accepting: held, answers_changed, pid 7, restarts 0"


def test_the_standing_keeps_a_failure_a_replay_cannot_clear_and_a_bounded_history() -> None:
    standing = Standing().took(CHANGED, GateKind.replay)
    assert standing.wrong_answers == CHANGED.sentence and Standing().took(PASS, GateKind.start).wrong_answers is None
    assert standing.took(PASS, GateKind.replay).last is CHANGED, "a replay's pass does not clear it"
    assert standing.took(PASS, GateKind.wake).last is CHANGED
    assert standing.took(PASS, GateKind.accept).last is PASS and standing.took(PASS, GateKind.start).last is PASS
    many = Standing()
    for _ in range(HISTORY + 5):
        many = many.took(PASS, GateKind.replay)
    assert len(many.history) == HISTORY and many.runs == {(GateKind.replay, PASS.verdict): HISTORY + 5}
    gone = standing.progressed(Progress(0.0, (Part.fingerprint,)), GateKind.replay).new_instance()
    assert gone.last is None and gone.running is None and gone.history == standing.history
    view = standing.view(3.0, lambda at: 1000.0 + at)
    assert view["verdict"] == "answers_changed" and view["at"] == 1002.0 and view["class"] == "answers_changed"
    assert view["history"] == [{"at": 1002.0, "kind": "replay", "verdict": "answers_changed", "seconds": 2.0,
                                "refused": True, "sentence": CHANGED.sentence}]


def test_vllms_wake_line_is_heard() -> None:
    assert woke("INFO 05-03 10:00:00 [api_router.py:50] wake up the engine with tags: ['weights']")
    assert not woke("INFO 05-03 10:00:00 [api_router.py:71] check whether the engine is sleeping")


def test_the_start_timing_says_the_gates_seconds_apart_from_vllms() -> None:
    timing = LaunchTiming(requested_at=0.0, exec_at=2.0).accepting(50.0).ready(53.5)
    shown = timing.to_json()
    assert shown["vllm_start_s"] == 48.0 and shown["accept_s"] == 3.5
    assert LaunchTiming(requested_at=0.0, exec_at=2.0).ready(50.0).to_json()["accept_s"] is None
