"""The control API: the commands (``sparkd.commands``) over HTTP, on a unix socket and on the TCP port.

Routes are built from the commands (:class:`sparkd.commands.command.Command`, the operator's and the ranks'):
``/v1/<name>`` runs ``execute(control, Request.from_params(…))`` and answers with the command's envelope. The
unix socket is created by sparkd itself (mode 0660, the configured group) before uvicorn serves it, so there is
never a moment when it is open to everyone; a command marked ``root_only`` (handover, recreate) runs only for a
caller whose uid is 0 (``SO_PEERCRED``) and is not served over TCP. The TCP port serves ``/metrics`` to anyone
and everything else only to the configured peers' signed requests (``sparkd.api.gates``); it also carries the
ranks' own commands. Both listeners bound what a client may cost: connections per source counted when accepted,
before TLS, with room kept for the proven peers and root (:mod:`sparkd.api.accepting`), a TLS handshake deadline,
a deadline on each whole request, an idle timeout, a header size cap and a 64 KiB body cap.
uvicorn's own signal handling is switched off: the daemon owns the signals.
``/runbook`` (:mod:`sparkd.api.runbook`) is as open as ``/metrics``: an alert's link reaches it without a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from sparkd.api.accepting import Doorway
from sparkd.api.admission import Ticket
from sparkd.api.bounded import Caller, Listener, caller_of
from sparkd.api.gates import SIGNED_KEY, BodyLimit, PeerGate
from sparkd.api.runbook import with_runbook
from sparkd.commands import operator
from sparkd.commands.base import BadRequest, Reply, Stream
from sparkd.commands.port import Control, Served
from sparkd.host.logs import Logger

IDLE_TIMEOUT_S = 5  # keep-alive connections with no request are closed after this
MAX_HEADER_BYTES = 64 * 1024
BACKLOG = 128


class _QuietServer(uvicorn.Server):
    """uvicorn's server on a socket of sparkd's own, whose connections come through a :class:`Doorway`: admitted
    when accepted, before TLS (uvicorn's ``create_server`` would wrap each in TLS first)."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, listener: Listener,
                 ssl_context: ssl.SSLContext | None) -> None:
        super().__init__(config)
        self.sock = sock
        self.listener = listener
        self.ssl_context = ssl_context

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the daemon handles signals

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.servers = []  # no asyncio server: the doorway accepts (main_loop)
        self.started = True

    def _protocol_for(self, caller: Caller, ticket: Ticket) -> asyncio.Protocol:
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state)
        return protocol.admitted(caller, ticket)  # type: ignore[attr-defined]

    async def main_loop(self) -> None:
        """Accept through the doorway until cancelled (sparkd ends its servers so). uvicorn's own loop would wake
        every 0.1 s to renew the Date header and look for an exit request: the protocol renews the header when a
        request comes (:meth:`sparkd.api.bounded.Listener.renew_date`), and nothing here wakes at rest."""
        await Doorway(self.sock, self.listener.slots, self.listener.identify, self._protocol_for,
                      ssl_context=self.ssl_context, handshake_s=self.listener.handshake_s).run()


def bind_unix_socket(path: Path, *, mode: int = 0o660, group: str | None = None) -> socket.socket:
    """Bind ``path`` with ``mode`` (the umask at bind time) and ``group`` set before anyone can connect. The
    group is set without following a symlink (``lchown``): a link put in its place is never followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    if group:
        with contextlib.suppress(KeyError, PermissionError):
            os.chown(path, -1, grp.getgrnam(group).gr_gid, follow_symlinks=False)
    sock.listen(64)
    return sock


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def command_routes(control: Control, commands: Iterable[Served], *, tcp: bool = False) -> list[Route]:
    return [Route(cmd.path, _handler(control, cmd, tcp=tcp), methods=[cmd.method]) for cmd in commands]


def _root_refusal(request: Request, cmd: Served, tcp: bool) -> Reply | None:
    """Why a ``root_only`` command is refused to this caller, or None (root on the control socket)."""
    if not cmd.root_only:
        return None
    if tcp:
        return Reply(False, error=f"{cmd.name} is not served over TCP: run it as root on the node", code=403)
    caller = caller_of(request.scope)
    if caller is None or caller.uid != 0:
        who = f"uid {caller.uid}" if caller is not None and caller.uid is not None else "an unknown caller"
        return Reply(False, error=f"{cmd.name} needs root (the caller is {who}): it leaves vLLM without a "
                     "supervisor or replaces its container; run it with sudo", code=403)
    return None


def _handler(control: Control, cmd: Served, *, tcp: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        denied = _root_refusal(request, cmd, tcp)
        if denied is not None:
            return _json(denied)
        params: dict[str, Any] = dict(request.query_params)
        # A signed body is JSON whatever its Content-Type says (which the signature covers too): a report cannot be
        # turned into nothing by a header.
        signed = bool(request.scope.get(SIGNED_KEY)) and bool(await request.body())
        if request.method == "POST" and (signed or request.headers.get("content-type", "").startswith(
                "application/json")):
            try:
                body = await request.json()
            except ValueError:
                return _json(Reply(False, error="the body is not JSON", code=400))
            except RecursionError:
                return _json(Reply(False, error="the body is nested too deeply", code=400))
            if not isinstance(body, dict):
                return _json(Reply(False, error="the body must be a JSON object", code=400))
            params.update(body)
        params["peer"] = request.client.host if request.client else "?"
        try:
            answering = cmd.answer(control, params)  # the request is parsed now: a bad one raises here
        except BadRequest as exc:
            return _json(Reply(False, error=str(exc), code=400))
        reply = await answering
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


def build_app(control: Control) -> ASGIApp:
    """The unix-socket app: who may connect is decided by the socket's mode and group, who may hand over or
    recreate by the caller's uid."""
    return BodyLimit(Starlette(routes=command_routes(control, operator()),
                               exception_handlers={404: _not_found, 405: _not_found}))


def build_tcp_app(control: Control, token: str | None, metrics: Callable[[], bytes],
                  rank_commands: Iterable[Served] = (), *, tls: bool = False, log: Logger | None = None) -> ASGIApp:
    """The TCP app: /metrics for Prometheus, /runbook for anyone who follows an alert's link; the control API and
    the ranks' commands for the peers' signed requests only."""

    async def scrape(request: Request) -> Response:
        return Response(metrics(), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[Route("/metrics", scrape),
                            *command_routes(control, (*operator(), *rank_commands), tcp=True)],
                    exception_handlers={404: _not_found, 405: _not_found})
    return with_runbook(PeerGate(BodyLimit(app), token, tls=tls, log=log, node=_node_name(control)))


def _node_name(control: Control) -> Callable[[], str | None]:
    """This node's name, read from its status once (a reload keeps it)."""
    known: list[str | None] = []

    def name() -> str | None:
        if not known:
            known.append(control.status().get("node") or None)
        return known[0]

    return name


async def serve(app: ASGIApp, sock: socket.socket, listener: Listener, *,
                ssl_context: ssl.SSLContext | None = None) -> None:
    config = uvicorn.Config(
        app, http=listener.protocol(), lifespan="off", log_level="warning", access_log=False, log_config=None,
        # The listener's slots bound the connections (and so the requests: one at a time on each); uvicorn's own
        # cap counts every connection and would answer a peer 503 during a flood.
        limit_concurrency=None, timeout_keep_alive=IDLE_TIMEOUT_S, backlog=BACKLOG,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    await _QuietServer(config, sock, listener, ssl_context).serve()
