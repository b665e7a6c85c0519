"""`sparkctl weights` on a group's worker answers for the group through its head (``--local``: this node alone);
on the head and on a single node it answers itself."""

from __future__ import annotations

from typing import Any

import pytest

from sparkd.commands import weights
from sparkd.commands.base import BadRequest

pytestmark = pytest.mark.anyio
GROUP = {"scope": "group", "ok": True, "nodes": {"head": {"root": "/m", "files": 3, "hashed": 0, "pending": 0,
                                                           "duration_s": 0.1, "problem": None}}}


class Group:
    def __init__(self, answer: tuple[bool, dict[str, Any]]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, dict[str, Any], float | None]] = []

    async def forward(self, command: Any, request: Any = None, *, timeout_s: float | None = None) -> Any:
        self.asked.append((command.path, dict(request.to_params()), timeout_s))
        return self.answer


class Checks:
    def __init__(self) -> None:
        self.full: list[bool] = []

    async def weights_view(self, *, full: bool) -> dict[str, Any]:
        self.full.append(full)
        return {"scope": "node", "ok": True, "nodes": {}}


class Control:
    def __init__(self, worker: bool, group: Group | None) -> None:
        self.worker, self.group, self.checks = worker, group, Checks()


@pytest.mark.parametrize("full", [False, True])
async def test_a_worker_asks_its_head(full: bool) -> None:
    group = Group((True, {"ok": True, "result": GROUP, "forwarded_to": "10.0.0.1:9479"}))
    control = Control(True, group)
    reply = await weights.execute(control, weights.Request(full=full))  # type: ignore[arg-type]
    assert reply.ok and reply.result["forwarded_to"] == "10.0.0.1:9479" and control.checks.full == []
    assert group.asked == [("/v1/weights", {"full": full}, weights.FULL_TIMEOUT_S if full else weights.TIMEOUT_S)]
    assert weights.render(reply.result).startswith("weights (asked of the head 10.0.0.1:9479): the same on every node")


async def test_local_and_non_workers_answer_themselves_and_a_refusal_is_said() -> None:
    group = Group((True, {}))
    for control in (Control(True, group), Control(False, None)):
        reply = await weights.execute(control, weights.Request(local=control.worker))  # type: ignore[arg-type]
        assert reply.ok and control.checks.full == [False]
    assert group.asked == []
    control = Control(True, Group((False, {"error": "the head is unreachable (refused); use --local"})))
    reply = await weights.execute(control, weights.Request())  # type: ignore[arg-type]
    assert not reply.ok and "use --local" in (reply.error or "")


def test_the_request_reads_local_from_a_query_or_a_body() -> None:
    assert weights.Request.from_params({"full": "1", "local": "1"}) == weights.Request(True, True)
    assert weights.Request.from_params({"local": True}) == weights.Request(False, True)
    assert weights.Request(True, False).to_params() == {"full": True}
    with pytest.raises(BadRequest):
        weights.Request.from_params({"local": "maybe"})
