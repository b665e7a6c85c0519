"""The control API as HTTP clients see it, over the real daemon loop in-process (httpx over sparkd.testing.http, no
socket): one envelope ``{ok, result}`` / ``{ok, error, result}`` with a status code that says what happened, and
the TCP listener's token gate (tests/MUTATION.md M28u, F16, F17, F19). tests/integration/test_observe.py holds the
same over a real socket and a real process."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from loop_harness import Node, config, running

from sparkd.api.bounded import Caller
from sparkd.api.messages import MAX_BODY, Handler
from sparkd.api.server import build_app, build_tcp_app
from sparkd.cluster.peersign import SCHEME, Ends, sign
from sparkd.commands.base import BadRequest, flag
from sparkd.commands.rank import RANK
from sparkd.testing import FakeClock, FakeRuntime
from sparkd.testing.http import HandlerTransport

pytestmark = pytest.mark.anyio
TOKEN = "s3cret-token-of-at-least-32-bytes-0123456789"


@asynccontextmanager
async def client(app: Handler, caller: Caller | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` as the listener serves it to ``caller`` (sparkd/api/http11.py tells each request who is calling)."""
    async with httpx.AsyncClient(transport=HandlerTransport(app, caller), base_url="http://sparkd") as http:
        yield http


def tcp_app(node: Node, token: str | None) -> Handler:
    return build_tcp_app(node.daemon.control, token, lambda: b"# metrics\n", RANK)


async def test_every_answer_is_one_envelope_with_a_status_code_that_says_what_happened(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path, restart={"budget_failures": 1}), runtime, clock) as node, \
            client(build_app(node.daemon.control)) as http:
        await node.until_state("ready")
        answer = await http.get("/v1/status")
        assert answer.status_code == 200 and answer.json().keys() == {"ok", "result"}
        assert answer.json()["ok"] is True and answer.json()["result"]["state"] == "ready"

        runtime.crash()
        await node.until_state("failed")
        refused = await http.post("/v1/start")
        assert refused.status_code == 409
        body = refused.json()
        assert body.keys() == {"ok", "error", "result"} and body["ok"] is False
        assert "breaker is open" in body["error"] and body["result"]["state"] == "failed"  # the status comes along

        bad = await http.get("/v1/logs", params={"lines": "many"})
        assert bad.status_code == 400 and bad.json()["ok"] is False and "lines" in bad.json()["error"]
        unknown = await http.post("/v1/launch-now")
        assert unknown.status_code == 404 and unknown.json() == {
            "ok": False, "error": "no such command: POST /v1/launch-now", "result": None}
        wrong_method = await http.get("/v1/start")
        assert wrong_method.status_code == 404 and wrong_method.json()["ok"] is False
        assert len(runtime.launches) == 1  # nothing refused was carried out


HERE = "10.0.0.1:9479"  # where the peers' connections arrive
PEER = Caller("10.0.0.2", False, peer="10.0.0.2", local=HERE)
STRANGER = Caller("10.0.0.3", False, local=HERE)
FROM_PEER = Ends("worker", "10.0.0.2", HERE)


def signed(method: str, path: str, body: bytes = b"", *, secret: str = TOKEN, at: float | None = None,
           ends: Ends = FROM_PEER, content_type: str = "") -> dict[str, str]:
    return {"Authorization": sign(secret, method, path, body, now=time.time() if at is None else at, ends=ends,
                                  content_type=content_type)}


@pytest.mark.parametrize(("path", "method"), [("/v1/status", "GET"), ("/v1/stop", "POST"), ("/v1/logs", "GET")])
async def test_the_tcp_api_serves_a_peers_signed_fresh_requests_only(tmp_path: Path, path: str, method: str) -> None:
    """Security review §2: a bearer token seen on the wire opened everything, from any host, forever."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        refusals = {
            "no signature": {}, "the old bearer token": {"Authorization": f"Bearer {TOKEN}"},
            "another secret": signed(method, path, secret="another-secret-of-32-bytes-or-more"),
            "signed for another path": signed(method, "/v1/restart"),
            "signed by another sender": signed(method, path, ends=Ends("worker", "10.0.0.9", HERE)),
            "signed for another recipient": signed(method, path, ends=Ends("worker", "10.0.0.2", "10.0.0.2:9479")),
            "signed for another Content-Type": signed(method, path, content_type="text/plain"),
            "signed by this node itself": signed(method, path, ends=Ends("scripted", "10.0.0.2", HERE)),
            "too old": signed(method, path, at=time.time() - 45),
        }
        async with client(tcp_app(node, TOKEN), PEER) as http:
            for what, headers in refusals.items():
                answer = await http.request(method, path, headers=headers)
                assert answer.status_code == 401, what
                assert answer.headers["www-authenticate"] == SCHEME and answer.json()["ok"] is False, what
                assert answer.headers["connection"] == "close", what  # a refused client keeps no slot
                if what == "signed by this node itself":
                    assert "signed by this node (scripted) itself" in answer.json()["error"]
            assert "45 s behind this node's clock" in answer.json()["error"]
            assert node.state == "ready"  # the refused stops did nothing
            good = signed(method, path)
            answer = await http.request(method, path, headers=good)
            assert answer.status_code == 200 and answer.json()["ok"] is True
            replay = await http.request(method, path, headers=good)
            assert replay.status_code == 401 and "replayed" in replay.json()["error"]
        async with client(tcp_app(node, TOKEN), STRANGER) as http:
            answer = await http.request(method, path, headers=signed(method, path))
            assert answer.status_code == 403
            assert answer.json()["error"] == ("only this node's peers ([cluster] peers) may use /v1/* over TCP; "
                                              "10.0.0.3 is not one")


async def test_a_signed_body_is_read_as_json_whatever_its_content_type(tmp_path: Path) -> None:
    """Security review 2, #5: a signed failure report sent as text/plain was accepted with its body ignored."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        body = b'{"local": "maybe"}'
        async with client(tcp_app(node, TOKEN), PEER) as http:
            answer = await http.post("/v1/stop", content=body, headers={
                "content-type": "text/plain", **signed("POST", "/v1/stop", body, content_type="text/plain")})
            assert answer.status_code == 400 and "local: expected 1 or 0, got 'maybe'" in answer.json()["error"]
        assert node.state == "ready"


async def test_without_a_token_file_the_tcp_api_serves_metrics_only(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        for caller in (PEER, STRANGER):
            async with client(tcp_app(node, None), caller) as http:
                answer = await http.get("/v1/status", headers=signed("GET", "/v1/status"))
                assert answer.status_code == 403 and "token_file" in answer.json()["error"]
                metrics = await http.get("/metrics")
                assert metrics.status_code == 200 and metrics.text == "# metrics\n"


async def test_handover_and_recreate_need_root_on_the_control_socket(tmp_path: Path) -> None:
    """Security review §6: a group member's `sparkctl handover` left vLLM running with no supervisor."""
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        member = Caller("uid:1000", False, uid=1000)
        async with client(build_app(node.daemon.control), member) as http:
            for command in ("handover", "recreate"):
                answer = await http.post(f"/v1/{command}")
                assert answer.status_code == 403, command
                assert answer.json()["error"].startswith(f"{command} needs root (the caller is uid 1000)")
        async with client(build_app(node.daemon.control), Caller("uid:0", True, uid=0)) as http:
            answer = await http.post("/v1/recreate")  # past the gate: refused for what it is
            assert answer.status_code == 409 and "stop it first" in answer.json()["error"]
        async with client(tcp_app(node, TOKEN), PEER) as http:
            answer = await http.post("/v1/handover", headers=signed("POST", "/v1/handover"))
            assert answer.status_code == 403 and "not served over TCP" in answer.json()["error"]
        assert node.state == "ready"


async def test_a_body_over_64_kib_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """Security review §6: a 300 MB body took the daemon from 53 MB to 812 MB."""
    runtime, clock = FakeRuntime(), FakeClock()
    big = b'{"local": "' + b"x" * MAX_BODY + b'"}'

    async def trickle() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 4096):
            yield big[start:start + 4096]

    async with running(config(tmp_path), runtime, clock) as node, client(build_app(node.daemon.control)) as http:
        await node.until_state("ready")
        by_length = await http.post("/v1/stop", content=big, headers={"content-type": "application/json"})
        assert by_length.status_code == 413 and "64 KiB" in by_length.json()["error"]
        streamed = await http.post("/v1/stop", content=trickle(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        deep = await http.post("/v1/stop", content=b"[" * 50000, headers={"content-type": "application/json"})
        assert deep.status_code == 400 and deep.json()["error"] == "the body is nested too deeply"
        assert node.state == "ready"


async def test_a_body_must_be_a_json_object_and_a_bad_one_is_a_400_not_a_crash(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node, client(build_app(node.daemon.control)) as http:
        await node.until_state("ready")
        for body, words in ((b"[1, 2]", "must be a JSON object"), (b'"local"', "must be a JSON object"),
                            (b"{not json", "not JSON")):
            answer = await http.post("/v1/stop", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 400, answer.text
            assert answer.json()["ok"] is False and words in answer.json()["error"]
        assert node.state == "ready"  # nothing was carried out
        answer = await http.post("/v1/stop", json={"local": "true"})
        assert answer.status_code == 200 and answer.json()["ok"] is True


@pytest.mark.parametrize(("given", "value"), [
    ("1", True), ("true", True), ("yes", True), ("0", False), ("false", False), ("no", False), ("", False)])
def test_a_flag_reads_as_http_clients_write_it(given: str, value: bool) -> None:
    """sparkctl sends 1; curl users write ?local=true or yes — never silently read as false."""
    assert flag({"local": given}, "local") is value
    assert flag({}, "local") is False


def test_a_flag_that_is_neither_names_the_parameter() -> None:
    with pytest.raises(BadRequest, match="local: expected 1 or 0, got 'maybe'"):
        flag({"local": "maybe"}, "local")
