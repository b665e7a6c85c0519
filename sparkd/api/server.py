"""The control API: the commands (``sparkd.commands``) over HTTP, on a unix socket and on the TCP port.

Routes are built from the command modules: ``/v1/<NAME>`` runs ``execute(control, Request.from_params(…))`` and
answers with the command's envelope. The unix socket is created by sparkd itself (mode 0660, the configured
group) before uvicorn serves it, so there is never a moment when it is open to everyone. The TCP port serves
``/metrics`` to anyone and everything else only with the bearer token; it also carries the ranks' own
commands. Both listeners bound what a client may cost: a connection limit, header and idle timeouts, and a
header size cap. uvicorn's own signal handling is switched off: the daemon owns the signals.
"""

from __future__ import annotations

import contextlib
import grp
import hmac
import os
import socket
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkd.api.bounded import MAX_CONNECTIONS, BoundedH11
from sparkd.commands import OPERATOR
from sparkd.commands.base import BadRequest, Control, Reply, Stream

IDLE_TIMEOUT_S = 5  # keep-alive connections with no request are closed after this
MAX_HEADER_BYTES = 64 * 1024


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the daemon handles signals

    async def main_loop(self) -> None:
        """uvicorn wakes every 0.1 s to renew the Date header once a second and to look for an exit request;
        sparkd ends its servers by cancelling them, so once a second is enough (10 fewer wake-ups a second)."""
        while not await self.on_tick(0):  # tick 0 renews the Date header
            await anyio.sleep(1.0)


def bind_unix_socket(path: Path, *, mode: int = 0o660, group: str | None = None) -> socket.socket:
    """Bind ``path`` with ``mode`` and ``group`` set before anyone can connect."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    if group:
        with contextlib.suppress(KeyError, PermissionError):
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
    sock.listen(64)
    return sock


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def command_routes(control: Control, commands: Iterable[Any]) -> list[Route]:
    return [Route(f"/v1/{cmd.NAME}", _handler(control, cmd), methods=[cmd.METHOD]) for cmd in commands]


def _handler(control: Control, cmd: ModuleType | Any) -> Callable[[Request], Any]:
    async def handle(request: Request) -> Response:
        params: dict[str, Any] = dict(request.query_params)
        if request.method == "POST" and request.headers.get("content-type", "").startswith("application/json"):
            try:
                body = await request.json()
            except ValueError:
                return _json(Reply(False, error="the body is not JSON", code=400))
            if not isinstance(body, dict):
                return _json(Reply(False, error="the body must be a JSON object", code=400))
            params.update(body)
        params["peer"] = request.client.host if request.client else "?"
        try:
            parsed = cmd.Request.from_params(params)
        except BadRequest as exc:
            return _json(Reply(False, error=str(exc), code=400))
        reply = await cmd.execute(control, parsed)
        if isinstance(reply, Stream):
            return StreamingResponse(_lines(reply.lines), media_type="text/plain")
        return _json(reply)

    return handle


def _json(reply: Reply) -> JSONResponse:
    then = reply.then
    if then is None:
        return JSONResponse(reply.envelope(), reply.code)

    async def after() -> None:  # in the event loop, once the answer is out
        then()

    return JSONResponse(reply.envelope(), reply.code, background=BackgroundTask(after))


async def _lines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line + "\n"


async def _not_found(request: Request, exc: Exception) -> Response:
    return _json(Reply(False, error=f"no such command: {request.method} {request.url.path}", code=404))


def build_app(control: Control) -> Starlette:
    """The unix-socket app: who may connect is decided by the socket's mode and group."""
    return Starlette(routes=command_routes(control, OPERATOR),
                     exception_handlers={404: _not_found, 405: _not_found})


def build_tcp_app(control: Control, token: str | None, metrics: Callable[[], bytes],
                  rank_commands: Iterable[Any] = ()) -> Starlette:
    """The TCP app: /metrics for Prometheus; the control API and the ranks' commands only with the token."""

    async def scrape(request: Request) -> Response:
        return Response(metrics(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", scrape), *command_routes(control, (*OPERATOR, *rank_commands))],
                     middleware=[Middleware(TokenGate, token=token)],
                     exception_handlers={404: _not_found, 405: _not_found})


class TokenGate:
    """ASGI middleware: everything but /metrics needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if self.token is None:
            refusal = _json(Reply(False, error="the control API is not open over TCP: no [api] token_file",
                                  code=403))
        elif not hmac.compare_digest(given, f"Bearer {self.token}".encode()):
            refusal = _json(Reply(False, error="missing or wrong bearer token", code=401))
            refusal.headers["WWW-Authenticate"] = "Bearer"
        else:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)


async def serve(app: Starlette, sock: socket.socket) -> None:
    config = uvicorn.Config(
        app, http=BoundedH11, lifespan="off", log_level="warning", access_log=False, log_config=None,
        limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=IDLE_TIMEOUT_S, backlog=MAX_CONNECTIONS,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    await _QuietServer(config).serve(sockets=[sock])
