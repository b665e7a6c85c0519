"""The control API: the commands (``sparkd.commands``) over HTTP, on a unix socket and on the TCP port.

Routes are built from the commands (:class:`sparkd.commands.command.Command`, the operator's and the ranks'):
``/v1/<name>`` runs ``execute(control, Request.from_params(…))`` and answers with the command's envelope. The
unix socket is created by sparkd itself (mode 0660, the configured group) before it is served, so there is
never a moment when it is open to everyone; a command marked ``root_only`` (handover, recreate) runs only for a
caller whose uid is 0 (``SO_PEERCRED``) and is not served over TCP. The TCP port serves ``/metrics`` to anyone
and everything else only to the configured peers' signed requests (``sparkd.api.gates``); it also carries the
ranks' own commands. Both listeners bound what a client may cost: connections per source counted when accepted,
before TLS, with room kept for the proven peers and root (:mod:`sparkd.api.accepting`), a TLS handshake deadline,
a deadline on each whole request, an idle timeout, a header size cap and a 64 KiB body cap (HTTP/1.1 on h11:
:mod:`sparkd.api.http11`). A path that no route serves with the request's method is answered 404.
``/runbook`` (:mod:`sparkd.api.runbook`) is as open as ``/metrics``: an alert's link reaches it without a token.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST

from sparkd.api.gates import BodyLimit, PeerGate
from sparkd.api.messages import Handler, Request, Response, json_response
from sparkd.api.runbook import with_runbook
from sparkd.commands import operator
from sparkd.commands.base import BadRequest, Reply, Stream
from sparkd.commands.port import Control, Served
from sparkd.host.logs import Logger

BACKLOG = 128


@dataclass(frozen=True)
class Route:
    path: str
    methods: frozenset[str]  # a GET route serves HEAD too
    handler: Handler


def route(path: str, method: str, handler: Handler) -> Route:
    return Route(path, frozenset({method, "HEAD"} if method == "GET" else {method}), handler)


def routed(routes: Iterable[Route]) -> Handler:
    """The handler of the request's path and method; 404 when none serves both."""
    table = {(r.path, method): r.handler for r in routes for method in r.methods}

    async def dispatch(request: Request) -> Response:
        handler = table.get((request.path, request.method))
        if handler is None:
            return _json(Reply(False, error=f"no such command: {request.method} {request.path}", code=404))
        return await handler(request)

    return dispatch


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
    return [route(cmd.path, cmd.method, _handler(control, cmd, tcp=tcp)) for cmd in commands]


def _root_refusal(request: Request, cmd: Served, tcp: bool) -> Reply | None:
    """Why a ``root_only`` command is refused to this caller, or None (root on the control socket)."""
    if not cmd.root_only:
        return None
    if tcp:
        return Reply(False, error=f"{cmd.name} is not served over TCP: run it as root on the node", code=403)
    caller = request.caller
    if caller is None or caller.uid != 0:
        who = f"uid {caller.uid}" if caller is not None and caller.uid is not None else "an unknown caller"
        return Reply(False, error=f"{cmd.name} needs root (the caller is {who}): it leaves vLLM without a "
                     "supervisor or replaces its container; run it with sudo", code=403)
    return None


def _handler(control: Control, cmd: Served, *, tcp: bool = False) -> Handler:
    async def handle(request: Request) -> Response:
        denied = _root_refusal(request, cmd, tcp)
        if denied is not None:
            return _json(denied)
        params = request.params()
        # A signed body is JSON whatever its Content-Type says (which the signature covers too): a report cannot be
        # turned into nothing by a header.
        signed = request.signed and bool(await request.body())
        if request.method == "POST" and (signed or request.header("content-type").startswith("application/json")):
            try:
                body = json.loads(await request.body())
            except ValueError:
                return _json(Reply(False, error="the body is not JSON", code=400))
            except RecursionError:
                return _json(Reply(False, error="the body is nested too deeply", code=400))
            if not isinstance(body, dict):
                return _json(Reply(False, error="the body must be a JSON object", code=400))
            params.update(body)
        params["peer"] = request.client or "?"
        try:
            answering = cmd.answer(control, params)  # the request is parsed now: a bad one raises here
        except BadRequest as exc:
            return _json(Reply(False, error=str(exc), code=400))
        reply = await answering
        if isinstance(reply, Stream):
            return Response(stream=_lines(reply.lines), content_type="text/plain; charset=utf-8")
        return _json(reply)

    return handle


def _json(reply: Reply) -> Response:
    return json_response(reply.envelope(), reply.code, after=reply.then)  # ``then``: once the answer is out


async def _lines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line + "\n"


def build_app(control: Control) -> Handler:
    """The unix-socket app: who may connect is decided by the socket's mode and group, who may hand over or
    recreate by the caller's uid."""
    return BodyLimit(routed(command_routes(control, operator())))


def build_tcp_app(control: Control, token: str | None, metrics: Callable[[], bytes],
                  rank_commands: Iterable[Served] = (), *, tls: bool = False, log: Logger | None = None) -> Handler:
    """The TCP app: /metrics for Prometheus, /runbook for anyone who follows an alert's link; the control API and
    the ranks' commands for the peers' signed requests only."""

    async def scrape(request: Request) -> Response:
        return Response(body=metrics(), content_type=CONTENT_TYPE_LATEST)

    app = routed([route("/metrics", "GET", scrape), *command_routes(control, (*operator(), *rank_commands), tcp=True)])
    return with_runbook(PeerGate(BodyLimit(app), token, tls=tls, log=log, node=_node_name(control)))


def _node_name(control: Control) -> Callable[[], str | None]:
    """This node's name, read from its status once (a reload keeps it)."""
    known: list[str | None] = []

    def name() -> str | None:
        if not known:
            known.append(control.status().get("node") or None)
        return known[0]

    return name
