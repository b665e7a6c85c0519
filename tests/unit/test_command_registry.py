"""One command shape (sparkd/commands/command.py), read by every end: a command added to the registry is served by
the daemon and offered by sparkctl with no other file touched; the peer link reaches the ranks' commands by their
descriptors, at the paths the server serves them, with the bodies it always sent; the status document types every
key the daemon sends."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fakedaemon import FakeDaemon
from loop_harness import config, running

import sparkd.cli.sparkctl as sparkctl
import sparkd.commands as registry
from sparkd.api.server import Route, command_routes
from sparkd.cluster.peers import wire
from sparkd.commands import recorder, status
from sparkd.commands.base import NoParams, Reply, flag, ok
from sparkd.commands.command import Cli, Command, Flag
from sparkd.commands.groupcheck import (
    RANK_BANDWIDTH,
    RANK_FABRIC,
    RANK_WEIGHTS,
    BandwidthRequest,
    FabricRequest,
    WeightsRequest,
)
from sparkd.commands.port import Control
from sparkd.commands.rank import RANK, RANK_FAILED, RANK_START, RANK_STOP, Failed
from sparkd.commands.statusdoc import Status
from sparkd.testing import FakeClock, FakeRuntime


@dataclass(frozen=True)
class HelloRequest:
    loud: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> HelloRequest:
        return cls(loud=flag(params, "loud"))

    def to_params(self) -> dict[str, bool]:
        return {"loud": self.loud}


async def _hello(control: Control, request: HelloRequest) -> Reply:
    return ok({"said": "HELLO" if request.loud else "hello"})


HELLO = Command("hello", "POST", HelloRequest, _hello, lambda result: f"the daemon said {result['said']}",
                cli=Cli(help="Say hello to the daemon.", flags=(Flag("loud", "Shout it."),)))


@pytest.fixture
def hello(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A new command the way docs/design.md says: one module (``COMMAND``) and its name in the registry."""
    module = types.ModuleType("sparkd.commands.hello")
    module.COMMAND = HELLO  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sparkd.commands.hello", module)
    names = (*registry.OPERATOR_NAMES, "hello")
    monkeypatch.setattr(registry, "OPERATOR_NAMES", names)
    monkeypatch.setattr(sparkctl, "OPERATOR_NAMES", names)
    yield
    sparkctl.main.commands.pop("hello", None)  # built when named


def one_answer(path: Path, body: bytes) -> FakeDaemon:
    """A daemon answering every request with one ok envelope."""
    return FakeDaemon(path, b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def test_a_command_in_the_registry_is_served_and_offered_by_sparkctl(hello: None, tmp_path: Path) -> None:
    served = {(route.path, *sorted(route.methods or ())) for route in command_routes(None, registry.operator())  # type: ignore[arg-type]
              if isinstance(route, Route)}
    assert ("/v1/hello", "POST") in served and ("/v1/status", "GET", "HEAD") in served

    runner = CliRunner()
    listing = runner.invoke(sparkctl.main, ["--help"]).output
    assert "hello       Say hello to the daemon." in listing
    assert "--loud         Shout it." in runner.invoke(sparkctl.main, ["hello", "--help"]).output

    daemon = one_answer(tmp_path / "d.sock", b'{"ok": true, "result": {"said": "HELLO"}}')
    try:
        said = runner.invoke(sparkctl.main, ["--socket", str(daemon.path), "hello", "--loud"])
    finally:
        daemon.listener.close()
    assert (said.exit_code, said.output) == (0, "the daemon said HELLO\n")
    assert daemon.request_lines == ["POST /v1/hello?loud=1 HTTP/1.1"]


def test_sparkctl_offers_every_registry_command_with_a_cli_and_no_other() -> None:
    offered = {name for name in sparkctl.main.list_commands(None)  # type: ignore[arg-type]
               if sparkctl.main.get_command(None, name) is not None}  # type: ignore[arg-type]
    with_cli = {c.name for c in registry.operator() if c.cli is not None}
    assert with_cli == set(registry.OPERATOR_NAMES) - {"recorder"}
    assert offered == with_cli | {"postmortem", "bundle"}


@pytest.mark.parametrize(("command", "request_", "sent"), [
    (RANK_STOP, NoParams(), ("POST", "/v1/rank/stop", None)),
    (RANK_START, NoParams(), ("POST", "/v1/rank/start", None)),
    (RANK_FAILED, Failed({"class": "oom", "message": "killed"}, "10.0.0.2"),
     ("POST", "/v1/rank/failed", {"failure": {"class": "oom", "message": "killed"}})),
    (RANK_WEIGHTS, WeightsRequest(True), ("POST", "/v1/rank/weights", {"full": True})),
    (RANK_BANDWIDTH, BandwidthRequest(2, 18515), ("POST", "/v1/rank/bandwidth", {"seconds": 2, "port": 18515})),
    (RANK_FABRIC, FabricRequest("10.0.0.1", 9000, ("10.0.0.1", 29500), 1.0),
     ("POST", "/v1/rank/fabric", {"address": "10.0.0.1", "size": 9000, "timeout_s": 1.0,
                                  "master": ["10.0.0.1", 29500]})),
    (status.COMMAND, NoParams(), ("GET", "/v1/status", None)),
    (recorder.COMMAND, recorder.Request(since=5.0, until=9.5, local=True),
     ("GET", "/v1/recorder?local=1&since=5.0&until=9.5", None)),
])
def test_the_peer_link_sends_what_the_server_serves(command: Command[Any, Any], request_: Any,
                                                    sent: tuple[str, str, Any]) -> None:
    assert wire(command, request_) == sent
    served = {(route.path, method) for route in command_routes(None, (*registry.operator(), *RANK))  # type: ignore[arg-type]
              if isinstance(route, Route) for method in route.methods or ()}
    assert (sent[1].split("?")[0], sent[0]) in served
    if sent[2] is not None:  # the body the daemon parses is the request the head meant
        assert command.request.from_params({**sent[2], "peer": "10.0.0.2"}) == request_


def test_a_query_string_carries_a_boolean_as_1_or_0() -> None:
    assert wire(Command("x", "GET", WeightsRequest, RANK_WEIGHTS.execute), WeightsRequest(True))[1] == "/v1/x?full=1"
    assert WeightsRequest.from_params({"full": "0"}) == WeightsRequest(False)


@pytest.mark.anyio
async def test_the_status_document_types_every_key_the_daemon_sends(tmp_path: Path) -> None:
    async with running(config(tmp_path), FakeRuntime(), FakeClock()) as node:
        await node.until_state("ready")
        sent = set(node.status())
    assert sent == Status.__required_keys__ | Status.__optional_keys__


@pytest.mark.parametrize(("args", "body", "sent", "printed"), [
    (["logs", "-n", "2"], b'{"ok": true, "result": ["one", "two"]}', "GET /v1/logs?lines=2&follow=0 HTTP/1.1",
     "one\ntwo\n"),
    (["incidents"], b'{"ok": true, "result": []}', "GET /v1/incidents HTTP/1.1", "\n"),
    (["preflight", "--dry-run"], b'{"ok": true, "result": {"ok": true, "results": []}}',
     "POST /v1/preflight?dry_run=1 HTTP/1.1", "\n"),
])
def test_the_subcommands_with_their_own_options_send_their_command(tmp_path: Path, args: list[str], body: bytes,
                                                                   sent: str, printed: str) -> None:
    daemon = one_answer(tmp_path / "d.sock", body)
    try:
        result = CliRunner().invoke(sparkctl.main, ["--socket", str(daemon.path), *args])
    finally:
        daemon.listener.close()
    assert (result.exit_code, result.output, daemon.request_lines) == (0, printed, [sent])
