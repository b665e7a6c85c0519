"""The acceptance gate in the daemon's real loop, in-process, with fakes (issue 37): a start passes through
``accepting`` to ready and records its golden; changed answers hold it there — vLLM running, never restarted — until
``sparkctl accept``; a warning serves degraded; replays run while idle and after a wake or an adoption, and a drift
found while serving is degraded with an incident, never a stop; the gate's budget is a net; the status, the metrics
and the incident carry the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from loop_harness import Node, config, running

from sparkd.commands import accept, restart
from sparkd.commands import status as status_command
from sparkd.config import Config
from sparkd.daemon.effects.accepting import AcceptanceGate
from sparkd.supervisor.health import VllmMetrics
from sparkd.testing import FakeAnswers, FakeClock, FakeProbes, FakeRuntime

pytestmark = pytest.mark.anyio

# The gate's budget is a day: the fake clock runs on while its worker threads read and write the golden, and only the
# test of the budget itself should see it spent.
GATE = {"enabled": True, "garble_levels": [1, 2], "replay_interval_s": 0, "timeout_s": 86400}
HOUR = 3600.0


def gated(tmp: Path, **acceptance: Any) -> Config:
    return config(tmp, acceptance={**GATE, **acceptance})


def incidents(tmp: Path) -> list[dict[str, Any]]:
    root = tmp / "state" / "incidents"
    return [json.loads((f / "incident.json").read_text()) for f in sorted(root.iterdir())] if root.is_dir() else []


def metric(node: Node, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted({"node": "scripted", **labels}.items()))
    for line in node.daemon.metrics.render().decode().splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


class Load(FakeProbes):
    """vLLM's metrics as the watch scrapes them: a request running (its tokens moving) while ``busy``."""

    busy = True
    tokens = 0.0

    async def metrics(self) -> VllmMetrics:
        self.tokens += 10.0 if self.busy else 0.0
        return VllmMetrics(num_requests_running=1.0 if self.busy else 0.0, generation_tokens_total=self.tokens,
                           num_requests_waiting=0.0)


def seen_states(node: Node) -> list[str]:
    return [e["state"] for e in node.status()["history"] if "phase" not in e]


async def test_a_start_passes_the_gate_records_its_golden_and_a_restart_matches_it(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until_state("ready")
        assert seen_states(node)[-3:] == ["starting", "accepting", "ready"]
        gate = node.status()["acceptance"]
        assert gate["verdict"] == "pass" and gate["kind"] == "start" and not gate["refused"]
        assert [p["part"] for p in gate["parts"]] == ["capacity", "fingerprint", "garble"]
        assert "6 answers recorded as the golden (no golden yet)" in gate["parts"][1]["sentence"]
        assert answers.asked == 6 + 1 + 2  # the fingerprint's, then the garble levels 1 and 2
        assert list((tmp_path / "state" / "acceptance").glob("golden-*.json"))
        assert node.status()["start_timing"]["accept_s"] is not None
        assert metric(node, "sparkd_acceptance_verdict", verdict="pass") == 1.0
        assert (await node.command(restart)).ok
        await node.until(lambda: node.state == "ready" and node.status()["launches"] == 2)
        gate = node.status()["acceptance"]
        assert gate["verdict"] == "pass" and gate["parts"][1]["sentence"] == "6 answers match the golden exactly."
        assert [h["verdict"] for h in gate["history"]] == ["pass", "pass"]
        assert metric(node, "sparkd_acceptance_runs_total", kind="start", verdict="pass") == 2.0
        assert "acceptance gate: pass (start" in status_command.render(node.status())


async def test_changed_answers_hold_the_start_never_restart_it_and_accept_lets_it_serve(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until_state("ready")
        answers.mode = "changed"  # the weights replaced under the same launch
        assert (await node.command(restart)).ok
        await node.until(lambda: node.status()["acceptance"]["refused"])
        status = node.status()
        assert status["state"] == "accepting" and not status["ready"]
        assert status["last_failure"]["class"] == "answers_changed"
        assert "differs from the golden at token 0" in status["last_failure"]["message"]
        assert "`sparkctl accept`" in status["last_failure"]["message"]
        launches, stops = len(runtime.launches), len(runtime.stops)
        held_at = clock.now()
        await node.until(lambda: clock.now() - held_at > HOUR, limit_s=2 * HOUR)
        await node.settled()
        assert node.state == "accepting" and len(runtime.launches) == launches and len(runtime.stops) == stops
        assert metric(node, "sparkd_acceptance_refused") == 1.0 and metric(node, "sparkd_ready") == 0.0
        rendered = status_command.render(node.status())
        assert "acceptance gate REFUSED ready (answers_changed)" in rendered
        assert status_command.exit_code(node.status()) == status_command.EXIT_NOT_SERVING
        found = incidents(tmp_path)
        assert [i["class"] for i in found] == ["answers_changed"]
        first = next(p for p in found[0]["acceptance"]["parts"] if p["part"] == "fingerprint")["facts"]
        assert first["first_difference"]["golden"] != first["first_difference"]["now"]
        assert "the golden answered" in found[0]["evidence"] and "; now " in found[0]["evidence"]
        reply = await node.command(accept)
        assert reply.ok and reply.result["verdict"] == "pass", reply.result
        assert node.state == "ready" and len(runtime.launches) == launches
        assert "by `sparkctl accept`" in node.status()["acceptance"]["parts"][1]["sentence"]
        assert (await node.command(restart)).ok
        await node.until(lambda: node.state == "ready" and len(runtime.launches) == launches + 1)
        assert node.status()["acceptance"]["verdict"] == "pass"
        assert len(incidents(tmp_path)) == 1


async def test_a_held_start_waits_without_a_tick_or_a_restart_for_hours(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime, mode="garble")
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until(lambda: node.status()["acceptance"]["refused"])
        assert node.status()["last_failure"]["class"] == "answers_garbled"
        held_at = clock.now()
        await node.until(lambda: clock.now() - held_at > 4 * HOUR, limit_s=5 * HOUR)
        assert node.state == "accepting" and len(runtime.launches) == 1 and runtime.stops == []
        assert node.daemon.sup._tick_wait() is None, "a refusal holds: nothing to check on time"


async def test_the_warn_policy_serves_degraded_with_the_verdict(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path, on_wrong_answers="warn"), runtime, clock, answers=answers) as node:
        await node.until_state("ready")
        answers.mode = "changed"
        assert (await node.command(restart)).ok
        await node.until(lambda: node.state == "degraded" and node.status()["launches"] == 2)
        status = node.status()
        assert status["ready"] and "vLLM serves anyway ([acceptance] policy warn)" in status["health"]
        assert status["acceptance"]["verdict"] == "answers_changed" and not status["acceptance"]["refused"]


async def test_a_replay_while_idle_finds_the_drift_degraded_never_stopped(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers, probes = FakeAnswers(runtime), Load(runtime)
    cfg = gated(tmp_path, replay_interval_s=600, replay_idle_s=30, garble_levels=[])
    async with running(cfg, runtime, clock, answers=answers, probes=lambda: probes) as node:
        await node.until_state("ready")
        ready_at = clock.now()
        await node.until(lambda: clock.now() - ready_at > 1200, limit_s=1300)
        assert [h["kind"] for h in node.status()["acceptance"]["history"]] == ["start"], "busy: no replay"
        probes.busy = False
        await node.until(lambda: len(node.status()["acceptance"]["history"]) == 2, limit_s=HOUR)
        assert node.status()["acceptance"]["history"][-1]["kind"] == "replay"
        assert node.status()["acceptance"]["history"][-1]["verdict"] == "pass"
        answers.mode = "changed"  # a wake that corrupted it, a kernel gone wrong
        await node.until(lambda: node.state == "degraded", limit_s=HOUR)
        status = node.status()
        assert status["acceptance"]["verdict"] == "answers_changed" and status["acceptance"]["kind"] == "replay"
        assert status["last_failure"]["class"] == "answers_changed"
        assert metric(node, "sparkd_acceptance_verdict", verdict="answers_changed") == 1.0
        await node.until(lambda: len(node.status()["acceptance"]["history"]) >= 5, limit_s=3 * HOUR)
        await node.settled()
        assert node.state == "degraded" and len(runtime.launches) == 1 and runtime.stops == []
        assert [i["class"] for i in incidents(tmp_path)] == ["answers_changed"], "the same drift: one incident"
        answers.mode = "normal"
        runs = len(node.status()["acceptance"]["history"])
        await node.until(lambda: len(node.status()["acceptance"]["history"]) > runs, limit_s=HOUR)
        status = node.status()
        assert status["acceptance"]["history"][-1]["verdict"] == "pass", "the drift went away by itself ..."
        assert node.state == "degraded" and status["acceptance"]["verdict"] == "answers_changed", "... and stands"
        assert (await node.command(accept)).ok and node.state == "ready"


async def test_a_wake_replays_the_answers_at_once(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until_state("ready")
        answers.mode = "changed"
        runtime.say("INFO 05-03 10:00:00 [api_router.py:50] wake up the engine with tags: None")
        # the fake clock runs on while the gate's worker threads read and write the golden: no tight limit
        await node.until(lambda: node.state == "degraded", limit_s=HOUR)
        assert node.status()["acceptance"]["kind"] == "wake"


async def test_an_adopted_instance_is_ready_at_once_and_replayed(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until(lambda: node.state == "ready" and bool(node.status()["acceptance"]["history"]))
    async with running(gated(tmp_path), runtime, clock, answers=answers) as again:  # sparkd restarted: adoption
        await again.until(lambda: again.status()["acceptance"]["verdict"] is not None)
        assert "accepting" not in seen_states(again) and again.state == "ready"
        gate = again.status()["acceptance"]
        assert gate["kind"] == "adopted" and gate["verdict"] == "pass"
        assert [p["part"] for p in gate["parts"]] == ["fingerprint"], "a replay: no garble levels beside users"
        assert len(runtime.launches) == 1


async def test_an_adopted_instance_that_answers_wrong_is_held(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until(lambda: node.state == "ready" and bool(node.status()["acceptance"]["history"]))
    answers.mode = "changed"  # what it answers changed while no sparkd watched (a hand-over across an upgrade)
    async with running(gated(tmp_path), runtime, clock, answers=answers) as again:
        await again.until(lambda: again.status()["acceptance"]["refused"])
        assert again.state == "accepting" and again.status()["acceptance"]["kind"] == "adopted"
        assert len(runtime.launches) == 1 and runtime.stops == []


async def test_no_gate_goes_straight_to_ready(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    async with running(config(tmp_path), runtime, clock, answers=answers) as node:
        await node.until_state("ready")
        assert "accepting" not in seen_states(node) and answers.asked == 0
        assert node.status()["acceptance"] == {**node.status()["acceptance"], "enabled": False, "verdict": None}
        refused = await node.command(accept)
        assert not refused.ok and "runs no acceptance gate" in refused.error


async def test_a_gate_that_never_answers_is_ended_by_its_budget(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    answers.hang = True
    async with running(gated(tmp_path, timeout_s=60, request_timeout_s=30), runtime, clock, answers=answers) as node:
        await node.until_state("accepting")
        began = clock.now()
        waited = await node.until_state("ready", limit_s=HOUR)
        assert 60 + 30 <= clock.now() - began <= 60 + 30 + 31 and waited > 0
        assert len(runtime.launches) == 1 and runtime.stops == []


async def test_a_gate_is_cancelled_with_its_instance(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    answers = FakeAnswers(runtime)
    answers.hang = True
    async with running(gated(tmp_path), runtime, clock, answers=answers) as node:
        await node.until(lambda: node.status()["acceptance"]["running"] is not None)
        gate: AcceptanceGate = node.daemon.acceptance
        runtime.crash(exit_code=1)
        await node.until(lambda: node.state in ("backoff", "preflight", "starting"))
        await node.settled()
        assert gate._scope is None and node.status()["acceptance"]["running"] is None
