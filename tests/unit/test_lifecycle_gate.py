"""The acceptance gate in the lifecycle table (sparkd/supervisor/lifecycle.py rules 7 to 9) and in the node's fold:
``accepting`` between starting and ready, a refusal that holds and never restarts, a warning that serves degraded,
replays while serving that never stop vLLM. Pure: no clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.daemon.loop.nodestate import NodeState, fold, limits_from
from sparkd.supervisor import lifecycle
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.acceptance.gate import GateResult, Part, PartResult, Progress, decide
from sparkd.supervisor.acceptance.standing import GateKind
from sparkd.supervisor.failures import TREATMENT, Failure, FailureClass
from sparkd.supervisor.instance import Instance
from sparkd.supervisor.states import Limits, Machine, State
from sparkd.supervisor.timing import LaunchTiming

GATED = Limits(accept_s=450.0)
INSTANCE = Instance(runtime="process", pid=4000, create_time=1.0, config_hash="h")


def result(part: Part = Part.fingerprint, ok: bool | None = True, *, policy: str = "refuse", incomplete: bool = False,
           sentence: str = "The answer to prompt 'capital' (chat) differs from the golden at token 0") -> GateResult:
    parts = [PartResult(part, ok, sentence, 0.5, incomplete=incomplete)]
    return decide(parts, started_at=10.0, now=11.0, on_wrong_answers=policy, on_lost_performance=policy)


PASS = result()
CHANGED = result(ok=False)
WARNED = result(ok=False, policy="warn")
UNFINISHED = result(ok=None, incomplete=True, sentence="no answer in 120 s")
LOST = result(Part.capacity, ok=False, policy="warn", sentence="vLLM's KV cache holds 1,000 tokens: 500 (50.0%) fewer")


def at(state: State, **kw: object) -> Machine:
    return replace(Machine(), state=state, launches=1, started_at=0.0, **kw)  # type: ignore[arg-type]


def step(m: Machine, obs: v.Observation, now: float = 20.0, limits: Limits = GATED) -> lifecycle.Step:
    return lifecycle.step(m, obs, now, limits)


def kinds(actions: list[v.Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_launch_that_answers_goes_to_accepting_with_the_gate_and_its_budget() -> None:
    after, actions, edge = step(at(State.starting), v.BecameReady(), now=100.0)
    assert after.state is State.accepting and after.deadline == 550.0 and after.restart_state.ready_since is None
    assert actions == [v.RunGate("start")] and edge is not None


def test_no_gate_or_a_led_rank_is_ready_at_once() -> None:
    after, actions, _ = step(at(State.starting), v.BecameReady(), limits=Limits())
    assert after.state is State.ready and actions == []


def test_an_adopted_instance_is_ready_at_once_and_replayed() -> None:
    after, actions, _ = step(replace(at(State.starting), launches=0), v.BecameReady())
    assert after.state is State.ready and actions == [v.RunGate("adopted", "adopted at boot")]


@pytest.mark.parametrize(("gate", "state", "actions"), [
    (PASS, State.ready, []),
    (UNFINISHED, State.ready, []),
    (WARNED, State.degraded, ["RecordIncident"]),
    (LOST, State.degraded, ["RecordIncident"]),
    (CHANGED, State.accepting, ["RecordIncident"]),
], ids=["pass", "unfinished", "warned", "capacity lost", "refused"])
def test_the_verdict_in_accepting(gate: GateResult, state: State, actions: list[str]) -> None:
    before = at(State.accepting, deadline=500.0)
    after, acts, _ = step(before, v.GateDone(gate))
    assert after.state is state and kinds(acts) == actions
    assert after.deadline is None, "ready, degraded or held: no deadline either way"
    if state is State.accepting:
        assert after.last_failure is gate.failure and after.since == before.since
    if state is State.degraded:
        assert after.health_note == gate.sentence and after.last_failure is gate.failure
    if state is not State.accepting:
        assert after.restart_state.ready_since == 20.0


def test_a_refusal_holds_and_the_same_verdict_again_is_not_a_new_incident() -> None:
    held, _, _ = step(at(State.accepting, deadline=500.0), v.GateDone(CHANGED))
    again, actions, _ = step(held, v.GateDone(result(ok=False)), now=9000.0)
    assert again.state is State.accepting and actions == [] and again.last_failure is held.last_failure
    for obs in (v.Tick(), v.BecameReady(), v.Progress(), v.HealthRecovered(), v.ReplayDue("idle")):
        after, acts, _ = step(held, obs, now=1e9)
        assert after.state is State.accepting and acts == [], obs


def test_the_gates_budget_is_a_net_and_a_failure_while_accepting_is_a_failure() -> None:
    running = at(State.accepting, deadline=500.0)
    assert step(running, v.Tick(), now=499.0).machine.state is State.accepting
    assert step(running, v.Tick(), now=500.0).machine.state is State.ready
    crash = step(running, v.Exited(Failure.of(FailureClass.engine_dead, "the engine died", exit_code=1)))
    assert crash.machine.state is State.stopping and kinds(crash.actions) == ["RecordIncident", "Stop"]


@pytest.mark.parametrize("state", [State.ready, State.degraded])
@pytest.mark.parametrize("gate", [CHANGED, WARNED, LOST], ids=["refused", "warned", "lost"])
def test_a_verdict_while_serving_is_degraded_never_a_stop(state: State, gate: GateResult) -> None:
    after, actions, _ = step(at(state), v.GateDone(gate, "replay"))
    assert after.state is State.degraded and kinds(actions) == ["RecordIncident"]
    assert after.health_note == gate.sentence


def test_an_adopted_instances_refusal_holds_it_as_a_starts_does() -> None:
    held, actions, _ = step(at(State.ready), v.GateDone(CHANGED, "adopted"), now=30.0)
    assert held.state is State.accepting and held.deadline is None and kinds(actions) == ["RecordIncident"]
    warned, _, _ = step(at(State.ready), v.GateDone(WARNED, "adopted"))
    assert warned.state is State.degraded
    assert step(held, v.GateDone(PASS, "accept"), now=40.0).machine.state is State.ready


def test_a_drift_stands_until_an_accept_passes() -> None:
    drifted, _, _ = step(at(State.ready), v.GateDone(CHANGED, "replay"))
    for kind in ("replay", "wake", "adopted"):
        assert step(drifted, v.GateDone(PASS, kind)).machine.state is State.degraded, kind
    assert step(drifted, v.GateDone(PASS, "accept")).machine.state is State.ready
    health = replace(drifted, health_note="1 of 3 /health failures")  # not a gate's: an accept leaves it
    assert step(health, v.GateDone(PASS, "accept")).machine.state is State.degraded


def test_replays_are_asked_while_serving_only() -> None:
    assert step(at(State.ready), v.ReplayDue("idle")).actions == [v.RunGate("replay", "idle")]
    assert step(at(State.degraded), v.ReplayDue("woke", wake=True)).actions == [v.RunGate("wake", "woke")]
    assert step(at(State.ready), v.ReplayDue("idle"), limits=Limits()).actions == []
    for state in (State.starting, State.accepting, State.stopping, State.stopped):
        assert step(at(state), v.ReplayDue("idle")).edge is None


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("gate", [PASS, CHANGED, WARNED, LOST, UNFINISHED], ids=str)
@pytest.mark.parametrize("kind", list(GateKind))
def test_no_verdict_in_any_state_ever_stops_or_restarts_vllm(state: State, gate: GateResult, kind: GateKind) -> None:
    after, actions, edge = step(at(state, deadline=500.0 if state is State.accepting else None),
                                v.GateDone(gate, kind.value))
    assert not [a for a in actions if isinstance(a, v.Stop | v.Launch | v.RunPreflight)]
    assert edge is None or after.state in lifecycle.TABLE[(state, v.GateDone)].to
    assert after.state is state or state in (State.accepting, State.ready, State.degraded)


def test_the_gates_classes_name_their_policy_and_never_restart() -> None:
    for cls, policy in ((FailureClass.answers_changed, "on_wrong_answers"),
                        (FailureClass.answers_garbled, "on_wrong_answers"),
                        (FailureClass.capacity_lost, "on_lost_performance")):
        assert TREATMENT[cls].policy == policy and not TREATMENT[cls].restartable
    assert all(t.policy is None for c, t in TREATMENT.items() if c not in (
        FailureClass.answers_changed, FailureClass.answers_garbled, FailureClass.capacity_lost))


def cfg(**acceptance: object) -> Config:
    return config_from_mapping({"runtime": "process", "launch": {"model": "/m"}, "acceptance": acceptance},
                               source="test")


def test_the_limits_carry_the_gates_budget_unless_it_is_off_or_the_node_is_led() -> None:
    assert limits_from(cfg(timeout_s=100, request_timeout_s=20)).accept_s == 150.0
    assert limits_from(cfg(enabled=False)).accept_s is None
    led = config_from_mapping({"runtime": "process", "node": {"role": "worker", "rank": 1, "address": "10.0.0.2"},
                               "launch": {"model": "/m", "tensor_parallel_size": 2},
                               "cluster": {"master_addr": "10.0.0.1", "nnodes": 2, "peers": ["10.0.0.1"]}},
                              source="test")
    assert limits_from(led).accept_s is None


def test_the_fold_keeps_the_run_its_verdict_its_history_and_the_gates_time() -> None:
    s = replace(NodeState.boot(at(State.starting), cfg()), instance=INSTANCE,
                timing=LaunchTiming(requested_at=0.0, exec_at=1.0))
    s = fold(s, v.BecameReady(), 30.0).state
    assert s.state is State.accepting and s.timing is not None and s.timing.accepting_at == 30.0
    progress = Progress(30.0, (Part.fingerprint,))
    s = fold(s, v.GateProgress(progress, "start"), 31.0).state
    assert s.acceptance.running == progress and s.acceptance.running_kind is GateKind.start
    s = fold(s, v.GateDone(PASS, "start"), 32.0).state
    assert s.state is State.ready and s.acceptance.running is None and s.acceptance.last is PASS
    assert s.timing is not None and s.timing.to_json()["accept_s"] == 2.0 and s.timing.to_json()["vllm_start_s"] == 29.0
    assert s.acceptance.runs == {(GateKind.start, PASS.verdict): 1} and len(s.acceptance.history) == 1
    ignored = fold(replace(s, machine=at(State.stopping)), v.GateDone(CHANGED), 33.0).state
    assert ignored.acceptance.last is PASS, "a verdict the lifecycle does not take is not kept"
    gone = fold(replace(s, machine=at(State.stopping, after=None)), v.StopDone(), 34.0).state
    assert gone.acceptance.last is None and len(gone.acceptance.history) == 1
