"""The control API as HTTP clients see it, over the real daemon loop in-process (httpx's ASGI transport, no
socket): one envelope ``{ok, result}`` / ``{ok, error, result}`` with a status code that says what happened, and
the TCP listener's token gate (tests/MUTATION.md M28u, F16, F17, F19). tests/integration/test_observe.py holds the
same over a real socket and a real process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from loop_harness import Node, config, running
from starlette.applications import Starlette

from sparkd.api.server import build_app, build_tcp_app
from sparkd.commands.base import BadRequest, flag
from sparkd.commands.rank import RANK
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio
TOKEN = "s3cret-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def client(app: Starlette, token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sparkd",
                                 headers=headers) as http:
        yield http


def tcp_app(node: Node, token: str | None) -> Starlette:
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


@pytest.mark.parametrize(("path", "method"), [("/v1/status", "GET"), ("/v1/stop", "POST"), ("/v1/logs", "GET")])
async def test_the_tcp_api_needs_the_exact_bearer_token(tmp_path: Path, path: str, method: str) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        for given in (None, "wrong", f"{TOKEN}x", TOKEN[:-1], ""):
            async with client(tcp_app(node, TOKEN), given) as http:
                answer = await http.request(method, path)
            assert answer.status_code == 401, given
            assert answer.headers["www-authenticate"] == "Bearer"
            assert answer.json() == {"ok": False, "error": "missing or wrong bearer token", "result": None}
        assert node.state == "ready"  # the refused stop did nothing
        async with client(tcp_app(node, TOKEN), TOKEN) as http:
            answer = await http.request(method, path)
        assert answer.status_code == 200 and answer.json()["ok"] is True


async def test_without_a_token_file_the_tcp_api_serves_metrics_only(tmp_path: Path) -> None:
    runtime, clock = FakeRuntime(), FakeClock()
    async with running(config(tmp_path), runtime, clock) as node:
        await node.until_state("ready")
        for token in (None, "None", ""):
            async with client(tcp_app(node, None), token) as http:
                answer = await http.get("/v1/status")
                assert answer.status_code == 403 and "token_file" in answer.json()["error"]
                metrics = await http.get("/metrics")
                assert metrics.status_code == 200 and metrics.text == "# metrics\n"


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
