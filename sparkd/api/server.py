"""The control API server: a small Starlette app on uvicorn, bound to a pre-made unix socket.

The socket is created by sparkd itself (mode 0660, the configured group) before uvicorn serves it, so there
is never a moment when it is open to everyone. uvicorn's own signal handling is switched off: the daemon
owns SIGTERM.
"""

from __future__ import annotations

import contextlib
import grp
import hmac
import os
import socket
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkd.incidents import list_incidents
from sparkd.supervisor import machine as sm

if TYPE_CHECKING:
    from sparkd.daemon import Daemon

ACTIONS: dict[str, Callable[[], sm.Observation]] = {
    "start": sm.StartRequested, "stop": sm.StopRequested, "restart": sm.RestartRequested,
    "reset": sm.ResetRequested,
}


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the daemon handles signals


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


def control_routes(daemon: Daemon) -> list[Route]:
    async def status(request: Request) -> JSONResponse:
        return JSONResponse(daemon.status())

    async def action(request: Request) -> JSONResponse:
        name = request.path_params["action"]
        if name not in ACTIONS:
            return JSONResponse({"error": f"unknown action {name!r}; one of {sorted(ACTIONS)}"}, 404)
        refused = daemon.refusal(name)
        if refused:
            return JSONResponse({"ok": False, "error": refused, "status": daemon.status()}, 409)
        daemon.post(ACTIONS[name]())
        await anyio.sleep(0)
        return JSONResponse({"ok": True, "action": name, "status": daemon.status()})

    async def logs(request: Request) -> Response:
        lines = int(request.query_params.get("lines", "200"))
        follow = request.query_params.get("follow", "") in ("1", "true", "yes")
        backlog = daemon.vllm_log.last(lines)
        if not follow:
            return Response("".join(f"{line}\n" for line in backlog), media_type="text/plain")
        return StreamingResponse(_follow(daemon, backlog), media_type="text/plain")

    async def incidents(request: Request) -> JSONResponse:
        return JSONResponse(list_incidents(daemon.cfg.paths.incidents))

    async def preflight(request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse({"last": daemon.last_preflight})
        dry_run = request.query_params.get("dry_run", "") in ("1", "true", "yes")
        if not dry_run and daemon.instance is not None:
            return JSONResponse({"error": "vLLM is running: only a dry run is possible now"}, 409)
        report = await daemon.run_preflight_now(dry_run=dry_run)
        return JSONResponse({"ok": report.ok, "dry_run": dry_run, "results": report.to_json()})

    async def incident(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        for item in list_incidents(daemon.cfg.paths.incidents):
            if Path(item["path"]).name == name or Path(item["path"]).name.startswith(name):
                tail = (Path(item["path"]) / "log-tail.txt").read_text(errors="replace")
                return JSONResponse({**item, "log_tail": tail})
        return JSONResponse({"error": f"no incident {name!r}"}, 404)

    return [
        Route("/v1/status", status),
        Route("/v1/preflight", preflight, methods=["GET", "POST"]),
        Route("/v1/{action}", action, methods=["POST"]),
        Route("/v1/logs", logs),
        Route("/v1/incidents", incidents),
        Route("/v1/incidents/{name}", incident),
    ]


def build_app(daemon: Daemon) -> Starlette:
    """The unix-socket app: who may connect is decided by the socket's mode and group."""
    return Starlette(routes=control_routes(daemon))


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return token or None


def build_tcp_app(daemon: Daemon, token: str | None) -> Starlette:
    """The TCP app: /metrics for Prometheus; the control API only with the peer bearer token."""

    async def metrics(request: Request) -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics), *control_routes(daemon)],
                     middleware=[Middleware(TokenGate, token=token)])


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
            refusal = JSONResponse({"error": "the control API is not open over TCP: no [api] token_file"}, 403)
        elif not hmac.compare_digest(given, f"Bearer {self.token}".encode()):
            refusal = JSONResponse({"error": "missing or wrong bearer token"}, 401,
                                   headers={"WWW-Authenticate": "Bearer"})
        else:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


async def _follow(daemon: Daemon, backlog: list[str]) -> AsyncIterator[str]:
    send, receive = anyio.create_memory_object_stream[str](10000)
    unsubscribe = daemon.vllm_log.subscribe(lambda line: _offer(send, line))
    try:
        for line in backlog:
            yield line + "\n"
        async for line in receive:
            yield line + "\n"
    finally:
        unsubscribe()
        send.close()


def _offer(send: Any, line: str) -> None:
    with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
        send.send_nowait(line)


async def serve(app: Starlette, sock: socket.socket) -> None:
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    await _QuietServer(config).serve(sockets=[sock])
