"""Scripted histories of the real daemon loop (sparkd.testing) for what the audit of issues 12, 15 and 17 found
untested: a restart forgets the spent budget at the shell level, ignored observations are logged, a fresh start
says why, status shows the guard's decision, metrics carry a group member's rank and group, and the image is read
again at every preflight.

The harness (``config``, ``running``) is the one test_daemon_loop.py uses; sparkd's own log events are captured
with structlog's ``capture_logs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from test_daemon_loop import GuardGate, Node, config, running

from sparkd.commands import restart, stop
from sparkd.commands.status import render
from sparkd.guard.policy import Action, Decision, Level
from sparkd.runtime.base import ImageIdentity
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.lifecycle import IGNORED
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock, FakeRuntime, all_tasks_blocked

pytestmark = pytest.mark.anyio


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def test_restart_from_failed_forgets_the_spent_budget(tmp_path: Path) -> None:
    """Mutant M30 at the shell: with a budget of 2, a restart that kept the strikes would leave one spent, and the
    first crash after it would open the breaker again; forgotten, that crash only backs off."""
    cfg, runtime, clock = config(tmp_path, restart={"budget_failures": 2}), FakeRuntime(), FakeClock()
    async with running(cfg, runtime, clock) as node:
        for _ in range(2):
            await node.until_state("ready")
            runtime.crash()
            await node.until(lambda: node.state in ("backoff", "failed"))
        await node.until_state("failed")
        assert (await node.command(restart)).ok
        await node.until_state("ready")
        runtime.crash()
        await node.until(lambda: node.state in ("backoff", "failed"))
        assert node.state == "backoff", node.status()["breaker"]
        assert not node.status()["breaker"]["open"]


async def test_an_ignored_observation_is_logged_with_why(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    failure = Failure.of(FailureClass.unknown, "a late health failure")
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        assert (await node.command(stop)).ok
        await node.until_state("stopped")
        with capture_logs() as logs:
            node.daemon.sup.post(v.HealthFailed(failure))
            await all_tasks_blocked()
        assert node.state == "stopped"
    ignored = events(logs, "ignored")
    assert [(e["observation"], e["why"]) for e in ignored] == [
        ("HealthFailed", IGNORED[(State.stopped, v.HealthFailed)])]
    assert ignored[0]["log_level"] == "info"


async def test_a_missing_lifecycle_file_is_a_fresh_start_and_says_so(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    with capture_logs() as logs:
        async with running(config(tmp_path), runtime, clock) as node:
            await node.until_state("ready")
    fresh = events(logs, "lifecycle_fresh")
    assert len(fresh) == 1 and fresh[0]["path"] == str(tmp_path / "state" / "lifecycle.json")
    assert not events(logs, "lifecycle_unusable")


BAD_LIFECYCLE = [
    # the wrong shape: the state file's schema names the field; then the fresh start is logged
    ('{"version": 1, "intent": "stop", "strikes": [{"at": "x"}]}', "state_file_bad", "strikes: item 0: at",
     "lifecycle_fresh"),
    # the right shape, a value the lifecycle does not know: one line says both
    ('{"version": 1, "intent": "sideways"}', "lifecycle_unusable", "sideways", None),
    ('{"version": 1, "intent": "run", "strikes": [{"at": 1, "weight": 1, "class": "gremlins"}]}',
     "lifecycle_unusable", "gremlins", None),
    ('{"version": 1, "intent": "run", "last_failure": {"class": "oom"}}', "lifecycle_unusable", "sentence", None),
]


@pytest.mark.parametrize(("content", "event", "named", "then"), BAD_LIFECYCLE)
async def test_a_bad_lifecycle_file_is_set_aside_and_says_why(tmp_path: Path, content: str, event: str,
                                                              named: str, then: str | None) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    state = tmp_path / "state"
    state.mkdir()
    (state / "lifecycle.json").write_text(content)
    with capture_logs() as logs:
        async with running(config(tmp_path), runtime, clock) as node:
            await node.until_state("ready")  # the remembered "stop" was not taken: a fresh start runs vLLM
    said = events(logs, event)
    assert len(said) == 1 and said[0]["log_level"] == "warning" and named in said[0]["reason"]
    assert said[0]["set_aside"] == str(next(state.glob("lifecycle.json.bad-*")))
    assert not events(logs, "lifecycle_restored")
    if then is not None:
        assert len(events(logs, then)) == 1


GUARD_LINES = [
    # the guard's decision, whether it lets a start through → the line `sparkctl status` shows
    (Decision(Action.cooldown, Level.stop, False, "cool-down after the guard's stop 1.0 s ago", available=3 << 30,
              at=0.0), False,
     "  memory guard: cooldown (stop), refuses starts: cool-down after the guard's stop 1.0 s ago"),
    (Decision(Action.warn, Level.warn, False, "MemAvailable 9.5 GiB is below the warn floor 10 GiB",
              available=9 << 30, at=0.0), True,
     "  memory guard: warn (warn), allows starts: MemAvailable 9.5 GiB is below the warn floor 10 GiB"),
]


@pytest.mark.parametrize(("decision", "start_allowed", "line"), GUARD_LINES)
async def test_status_shows_the_guards_decision_and_whether_it_refuses_starts(
        tmp_path: Path, decision: Decision, start_allowed: bool, line: str) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    gate = GuardGate()
    gate.decision, gate.start_allowed = None, True  # type: ignore[assignment]  # no decision yet
    async with running(config(tmp_path), runtime, clock, guard=gate) as node:
        await node.until_state("ready")
        assert "memory guard:" not in render(node.status())  # no decision yet: nothing to show
        gate.decision, gate.start_allowed = decision, start_allowed
        shown = render(node.status()).splitlines()
    assert line in shown


def group_member(tmp: Path, rank: int) -> dict[str, dict[str, Any]]:
    """Rank ``rank`` of a TP=2 x PP=2 group whose head is 10.9.0.1 (nothing is contacted: the daemon is not run)."""
    token = tmp / "token"
    token.write_text("group-token\n")
    addresses = [f"10.9.0.{i + 1}" for i in range(4)]
    return {
        "node": {"name": f"spark{rank}", "role": "head" if rank == 0 else "worker", "rank": rank,
                 "address": addresses[rank]},
        "launch": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
        "cluster": {"master_addr": addresses[0], "master_port": 29501, "nnodes": 4,
                    "peers": addresses[1:] if rank == 0 else addresses[:1]},
        "api": {"token_file": str(token)},
    }


@pytest.mark.parametrize(("rank", "identity"), [
    (None, '{node="scripted"}'),  # a single node: no rank, no group
    (0, '{group="10.9.0.1:29501",node="spark0",rank="0"}'),
    (3, '{group="10.9.0.1:29501",node="spark3",rank="3"}'),  # the same group label on every rank
])
def test_metrics_carry_node_and_for_a_group_member_rank_and_group(tmp_path: Path, rank: int | None,
                                                                  identity: str) -> None:
    sections = {} if rank is None else group_member(tmp_path, rank)
    node = Node(config(tmp_path, **sections), FakeRuntime(), FakeClock())
    text = node.daemon.metrics.render().decode()
    for family in ("sparkd_ready", "sparkd_breaker_open", "sparkd_backoff_seconds"):
        assert f"{family}{identity} " in text, family
    assert "sparkd_build_info{" + identity[1:-1] + "," in text


class MovingTagRuntime(FakeRuntime):
    """vLLM from an image whose tag the test can move: the engine answers with whatever ``image_id`` is now."""

    def __init__(self) -> None:
        super().__init__()
        self.image_id = "sha256:aaaa"

    async def image_identity(self) -> ImageIdentity | None:
        return ImageIdentity(self.image_id)


async def test_the_image_is_read_again_at_every_preflight(tmp_path: Path) -> None:
    """A tag moved since boot (a `docker pull`): the next start's preflight reads it, and status shows the new
    image, not the one sparkd saw when it started."""
    runtime, clock = MovingTagRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        assert node.status()["image_id"] == "sha256:aaaa"
        runtime.image_id = "sha256:bbbb"
        assert node.status()["image_id"] == "sha256:aaaa"  # status reports what the last preflight read
        assert (await node.command(restart)).ok
        await node.until(lambda: len(runtime.launches) == 2 and node.state == "ready")
        assert node.status()["image_id"] == "sha256:bbbb"


async def test_preflight_verdicts_are_logged_at_the_level_they_mean(tmp_path: Path) -> None:
    """journalctl -p warning (the runbook's advice) shows a failing or warning check (issue 28): ok and fixed
    at info, warn at warning, fail at error."""
    from sparkd.preflight.base import Check, CheckResult, Verdict
    from sparkd.testing import failing_check, passing_check

    async def warns(ctx: Any) -> CheckResult:
        return CheckResult(Verdict.warn, "worth knowing")

    checks = (passing_check("fine"), Check("warns", warns), failing_check("port held", FailureClass.port_in_use))
    runtime, clock = FakeRuntime(), FakeClock()
    with capture_logs() as logs:
        async with running(config(tmp_path), runtime, clock, rand=0.0, checks=checks) as node:
            await node.until(lambda: node.state in ("backoff", "failed"))
    levels = {e["check"]: e["log_level"] for e in events(logs, "preflight")}
    assert levels == {"fine": "info", "warns": "warning", "scripted": "error"}


def test_metrics_start_every_restart_reason_at_zero_and_export_the_process(tmp_path: Path) -> None:
    """Issue 28: increase() sees the first restart of any reason; process_* describe the daemon itself."""
    node = Node(config(tmp_path), FakeRuntime(), FakeClock())
    text = node.daemon.metrics.render().decode()
    for reason in ("config_error", "oom", "operator", "reset"):
        assert f'sparkd_restarts_total{{node="scripted",reason="{reason}"}} 0.0' in text, reason
    assert "process_resident_memory_bytes " in text and "process_open_fds " in text
