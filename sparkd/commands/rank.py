"""What the ranks of a group ask of each other (``/v1/rank/<name>``, over TCP, signed, from the peers only).

The head asks each worker's daemon to stop its rank (and report any ``VLLM::*`` left), to preflight, and to
start its rank (closing its breaker: the head decides about the group's restarts), and while the group serves, for
its ranks' step records (the step probe, issue 38); a worker tells its head at once that its rank failed. These are
peer commands, kept apart from the operator's (``sparkd.commands.OPERATOR_NAMES``): only the TCP listener serves
them, to the configured peers' addresses, signed with the shared secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from sparkd.commands.base import BadRequest, NoParams, Reply, ok, refused
from sparkd.commands.command import Command
from sparkd.commands.groupcheck import GROUP_CHECKS
from sparkd.commands.statusdoc import Status
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import State

if TYPE_CHECKING:
    from sparkd.commands.port import Control

START_SETTLE_S = 5.0


# A rank's failure as it travels between the ranks: its class and its sentence (a peer's word: whoever reads one
# bounds it, ``sparkd.cluster.peers.claim``).
FailureReport = TypedDict("FailureReport", {"class": str, "message": str})


def failure_report(failure: Failure) -> FailureReport:
    """The one way a rank puts its failure on the wire."""
    return {"class": failure.cls.value, "message": failure.sentence}


class StopResult(TypedDict):
    vllm_left: list[int]  # this node's vLLM processes still there after the stop
    status: Status


class PreflightResult(TypedDict):
    ok: bool
    results: list[dict[str, object]]  # each check's (sparkd.preflight.base.as_json)
    failure: FailureReport | None


class StepsResult(TypedDict):
    """A node's step records (sparkd.supervisor.stepwire.reading_json): times on its own monotonic clock."""

    node: str
    read_at_ns: int
    records: list[dict[str, Any]]  # each a step record's fields
    states: list[dict[str, Any]]  # {"role", "rank", "state"}: each process's state letter
    problems: list[str]


@dataclass(frozen=True)
class Failed:
    failure: FailureReport | None
    peer: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Failed:
        failure = params.get("failure")
        if failure is not None and not isinstance(failure, dict):
            raise BadRequest("failure: expected an object with class and message")
        report: FailureReport | None = None if failure is None else {
            "class": str(failure.get("class")), "message": str(failure.get("message") or "")}
        return cls(report, str(params.get("peer", "?")))

    def to_params(self) -> dict[str, Any]:
        return {"failure": self.failure}


async def _stop(control: Control, request: NoParams) -> Reply:
    if not control.stopped():
        await control.submit(v.StopRequested())
        await control.settle(control.stopped, control.stop_timeout_s)
    stopped: StopResult = {"vllm_left": control.vllm_left(), "status": control.status()}
    return ok(stopped)


async def _preflight(control: Control, request: NoParams) -> Reply:
    if control.running():
        return ok({"ok": False, "failure": failure_report(Failure.of(FailureClass.unknown, "its rank is running"))})
    report = await control.preflight(dry_run=False)
    failure = report.failure()
    checked: PreflightResult = {"ok": report.ok, "results": report.to_json(),
                                "failure": None if failure is None else failure_report(failure)}
    return ok(checked)


async def _start(control: Control, request: NoParams) -> Reply:
    if control.status()["state"] == State.failed.value:
        await control.submit(v.ResetRequested())
    await control.submit(v.StartRequested())
    await control.settle(lambda: control.status()["state"] != State.stopped.value, START_SETTLE_S)
    return ok(control.status())


async def _failed(control: Control, request: Failed) -> Reply:
    if control.group is None:
        return refused("this node is not the head of a group", code=400)
    if not control.group.on_report(request.peer, request.failure):
        return refused(f"{request.peer} is not one of this node's [cluster] peers", code=403)
    return ok()


async def _steps(control: Control, request: NoParams) -> Reply:
    return ok(control.steps())


RANK_STOP: Command[NoParams, StopResult] = Command("rank/stop", "POST", NoParams, _stop)
"""Stop this rank; ``{"vllm_left": [pid, …], "status": …}``."""
RANK_PREFLIGHT: Command[NoParams, PreflightResult] = Command("rank/preflight", "POST", NoParams, _preflight)
"""Preflight this node (refused while its rank runs); ``{"ok", "results", "failure"}``."""
RANK_START: Command[NoParams, Status] = Command("rank/start", "POST", NoParams, _start)
"""Start this rank (closing its breaker: the head decides about the group's restarts); its status."""
RANK_FAILED: Command[Failed, None] = Command("rank/failed", "POST", Failed, _failed)
"""A worker tells its head that its rank failed (``failure``: ``{"class", "message"}``)."""

RANK_STEPS: Command[NoParams, StepsResult] = Command("rank/steps", "GET", NoParams, _steps)
"""This node's step records now (issue 38): the head's watch reads its workers' ranks through it."""

RANK = (RANK_STOP, RANK_PREFLIGHT, RANK_START, RANK_FAILED, RANK_STEPS, *GROUP_CHECKS)
