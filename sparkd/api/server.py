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

from sparkd.cluster.peers import PeerUnreachable
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
        local = request.query_params.get("local", "") in ("1", "true", "yes")
        if daemon.pair == "worker" and not local and name != "reset" and daemon.coordinator is not None:
            return await _forward_to_head(daemon, name)
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
        *rank_routes(daemon),
        Route("/v1/status", status),
        Route("/v1/preflight", preflight, methods=["GET", "POST"]),
        Route("/v1/{action}", action, methods=["POST"]),
        Route("/v1/logs", logs),
        Route("/v1/incidents", incidents),
        Route("/v1/incidents/{name}", incident),
    ]


async def _forward_to_head(daemon: Daemon, name: str) -> JSONResponse:
    """A worker acts on the whole pair through the head, which leads every start and restart."""
    assert daemon.coordinator is not None
    head = daemon.coordinator.client.peers[0]
    try:
        answer = await daemon.coordinator.client.request(head, "POST", f"/v1/{name}", retries=1)
    except PeerUnreachable as exc:
        return JSONResponse({"ok": False, "error": f"the head is unreachable ({exc}); use --local to act on "
                             "this rank alone", "status": daemon.status()}, 409)
    return JSONResponse({**answer, "forwarded_to": head}, 200 if answer.get("ok") else 409)


def rank_routes(daemon: Daemon) -> list[Route]:
    """What the head asks of a worker's daemon, and a worker tells its head."""

    async def rank_stop(request: Request) -> JSONResponse:
        if daemon.machine.state not in (sm.State.stopped, sm.State.failed) or daemon.instance is not None:
            daemon.post(sm.StopRequested())
            await daemon.wait_state(lambda: daemon.instance is None and daemon.machine.state in
                                    (sm.State.stopped, sm.State.failed), daemon.cfg.supervisor.stop_grace_s + 30)
        left = daemon.vllm_left()
        return JSONResponse({"ok": not left, "vllm_left": left, "status": daemon.status()})

    async def rank_preflight(request: Request) -> JSONResponse:
        if daemon.instance is not None:
            return JSONResponse({"ok": False, "failure": {"class": "unknown", "message": "its rank is running"}}, 409)
        report = await daemon.run_preflight_now(dry_run=False)
        daemon.last_preflight = report.to_json()
        failure = report.failure()
        return JSONResponse({"ok": report.ok, "results": report.to_json(), "failure": None if failure is None
                             else {"class": failure.cls.value, "message": failure.sentence}})

    async def rank_start(request: Request) -> JSONResponse:
        if daemon.machine.state is sm.State.failed:
            daemon.post(sm.ResetRequested())
        daemon.post(sm.StartRequested())
        await daemon.wait_state(lambda: daemon.machine.state is not sm.State.stopped, 5.0)
        return JSONResponse({"ok": True, "status": daemon.status()})

    async def rank_failed(request: Request) -> JSONResponse:
        body = await request.json()
        peer = request.client.host if request.client else "?"
        if daemon.coordinator is not None:
            daemon.coordinator.on_report(_peer_name(daemon, peer), body.get("failure"))
        return JSONResponse({"ok": True})

    return [
        Route("/v1/rank/stop", rank_stop, methods=["POST"]),
        Route("/v1/rank/preflight", rank_preflight, methods=["POST"]),
        Route("/v1/rank/start", rank_start, methods=["POST"]),
        Route("/v1/rank/failed", rank_failed, methods=["POST"]),
    ]


def _peer_name(daemon: Daemon, host: str) -> str:
    assert daemon.coordinator is not None
    for peer in daemon.coordinator.client.peers:
        if peer == host or peer.startswith(f"{host}:") or peer.startswith(f"[{host}]"):
            return peer
    return host


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
