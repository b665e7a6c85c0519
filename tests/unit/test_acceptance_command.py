"""``sparkctl accept`` (sparkd/commands/accept.py): its execute against the Control port (the daemon provides the gate
as ``DaemonControl.acceptance``; without it the command refuses and changes nothing), and sparkctl's side once the
command is in the registry (one line: ``OPERATOR_NAMES``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from fakedaemon import FakeDaemon

import sparkd.cli.sparkctl as sparkctl
import sparkd.commands as registry
from sparkd.commands import accept
from sparkd.commands.base import NoParams

PASSED = {"verdict": "pass", "sentence": "The acceptance gate passed in 3.2 s (capacity, fingerprint).",
          "refuse": False, "seconds": 3.2, "class": None,
          "parts": [{"part": "capacity", "ok": True, "sentence": "as expected."},
                    {"part": "fingerprint", "ok": True, "sentence": "6 answers recorded as the golden (no golden "
                                                                     "yet, by `sparkctl accept`)."}]}


class Gate:
    def __init__(self) -> None:
        self.accepted = 0

    async def accept(self) -> dict[str, Any]:
        self.accepted += 1
        return PASSED


class Control:
    def __init__(self, *, gate: Gate | None = None, worker: bool = False, running: bool = True,
                 state: str = "ready") -> None:
        if gate is not None:
            self.acceptance = gate
        self.worker, self._running, self.state = worker, running, state

    def running(self) -> bool:
        return self._running

    def status(self) -> dict[str, str]:
        return {"state": self.state}


def execute(control: Control) -> Any:
    return anyio.run(accept.execute, control, NoParams())  # type: ignore[arg-type]


@pytest.mark.parametrize(("control", "said"), [
    (Control(), "this sparkd runs no acceptance gate, so there are no answers to accept"),
    (Control(gate=Gate(), worker=True), "a group's answers are its head's: run `sparkctl accept` on the head"),
    (Control(gate=Gate(), running=False), "vLLM is not running: start it (`sparkctl start`), then accept its answers"),
    (Control(gate=Gate(), state="starting"),
     "vLLM does not answer yet (starting): wait until it is accepting or ready, then accept its answers"),
])
def test_refusals_change_nothing(control: Control, said: str) -> None:
    reply = execute(control)
    assert (reply.ok, reply.error, reply.code) == (False, said, 409)
    assert getattr(getattr(control, "acceptance", None), "accepted", 0) == 0


@pytest.mark.parametrize("state", ["accepting", "ready", "degraded"])
def test_the_gate_records_the_answers_and_answers_its_result(state: str) -> None:
    gate = Gate()
    reply = execute(Control(gate=gate, state=state))
    assert reply.ok and reply.result == PASSED and gate.accepted == 1
    assert accept.exit_code(PASSED) == 0 and accept.exit_code({**PASSED, "verdict": "garbled"}) == 1


def test_render_says_the_verdict_and_every_part() -> None:
    assert accept.render(PASSED).splitlines() == [
        "accept: pass in 3.2 s — The acceptance gate passed in 3.2 s (capacity, fingerprint).",
        "  capacity     ok     as expected.",
        "  fingerprint  ok     6 answers recorded as the golden (no golden yet, by `sparkctl accept`).",
    ]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    names = (*registry.OPERATOR_NAMES, "accept")
    monkeypatch.setattr(registry, "OPERATOR_NAMES", names)
    monkeypatch.setattr(sparkctl, "OPERATOR_NAMES", names)
    yield
    sparkctl.main.commands.pop("accept", None)


def test_once_registered_sparkctl_posts_it_and_prints_the_gate(registered: None, tmp_path: Path) -> None:
    body = json.dumps({"ok": True, "result": {**PASSED, "verdict": "answers_changed"}}).encode()
    daemon = FakeDaemon(tmp_path / "d.sock", b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    try:
        result = CliRunner().invoke(sparkctl.main, ["--socket", str(daemon.path), "accept"])
    finally:
        daemon.listener.close()
    assert daemon.request_lines == ["POST /v1/accept HTTP/1.1"]
    assert result.exit_code == 1 and result.output.startswith("accept: answers_changed in 3.2 s")
