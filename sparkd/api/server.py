"""The control API server: a small Starlette app on uvicorn, bound to a pre-made unix socket.

The socket is created by sparkd itself (mode 0660, the configured group) before uvicorn serves it, so there
is never a moment when it is open to everyone. uvicorn's own signal handling is switched off: the daemon
owns SIGTERM.
"""

from __future__ import annotations

import contextlib
import grp
import os
import socket
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

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


def build_app(daemon: Daemon) -> Starlette:
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
        return JSONResponse({"last": daemon.last_preflight})

    return Starlette(routes=[
        Route("/v1/status", status),
        Route("/v1/{action}", action, methods=["POST"]),
        Route("/v1/logs", logs),
        Route("/v1/incidents", incidents),
        Route("/v1/preflight", preflight),
    ])


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


async def serve_unix(daemon: Daemon, sock: socket.socket) -> None:
    config = uvicorn.Config(build_app(daemon), lifespan="off", log_level="warning", access_log=False)
    await _QuietServer(config).serve(sockets=[sock])
