"""What a request must pass before a command sees it (ASGI middleware).

- :class:`BodyLimit` (both listeners): a body is read whole before the command runs, and one over
  :data:`MAX_BODY` is answered 413 at once — by its ``Content-Length``, or when the bytes read pass the limit.
  A 300 MB body once took the daemon from 53 MB to 812 MB (security review §6).
- :class:`PeerGate` (the TCP port): ``/metrics`` is open; ``/v1/*`` is served only to a connection from a
  configured peer's address (and, with mutual TLS, one that presented a certificate chaining to ``tls_ca``), and
  only for a request signed with the shared secret by another node, for this connection's two ends and its
  Content-Type, fresh and never seen before (:mod:`sparkd.cluster.peersign`). The address and certificate are
  checked before any of the body is read. A verified request proves its connection (it moves to the peer's reserved
  room: :func:`sparkd.api.bounded.prove`); every refusal closes the connection, and a signed body is read as JSON
  whatever its Content-Type says (:data:`SIGNED_KEY`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sparkd.api.bounded import caller_of, prove
from sparkd.cluster.peersign import SCHEME, Refused, ReplayCache, verify
from sparkd.host.logs import Logger

MAX_BODY = 64 * 1024
LOG_EVERY_S = 60.0
SIGNED_KEY = "sparkd.signed"  # the scope's mark of a request whose signature verified


def refusal(error: str, code: int, **headers: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error": error, "result": None}, code, headers=headers or None)


def closing(error: str, code: int, **headers: str) -> JSONResponse:
    """A refusal that ends its connection: a client that was refused keeps no slot."""
    return refusal(error, code, connection="close", **headers)


class _TooLarge(Exception):
    pass


async def read_body(scope: Scope, receive: Receive, limit: int = MAX_BODY) -> bytes:
    """The whole request body; :class:`_TooLarge` past ``limit`` (by its Content-Length or as it is read)."""
    length = dict(scope.get("headers") or []).get(b"content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise _TooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then waits on the connection (for its disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def too_large(limit: int = MAX_BODY) -> JSONResponse:
    return refusal(f"the request body is larger than {limit // 1024} KiB", 413, connection="close")


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.limit)
        except _TooLarge:
            await too_large(self.limit)(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)


class PeerGate:
    """The TCP port's gate: ``/metrics`` for anyone, ``/v1/*`` for the peers' signed requests only."""

    def __init__(self, app: ASGIApp, secret: str | None, *, tls: bool = False, log: Logger | None = None,
                 wall: Callable[[], float] = time.time, replays: ReplayCache | None = None,
                 node: Callable[[], str | None] = lambda: None) -> None:
        self.app = app
        self.secret = secret
        self.tls = tls
        self.log = log
        self.wall = wall
        self.replays = replays or ReplayCache()
        self.node = node  # this node's name: a request signed with it is refused
        self._logged: dict[str, float] = {}  # source -> when a refusal of it was last logged

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/metrics":
            await self.app(scope, receive, send)
            return
        why = self._caller_refusal(scope)
        if why is not None:
            await why(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive)
        except _TooLarge:
            await too_large()(scope, receive, send)
            return
        query = scope.get("query_string") or b""
        target = scope.get("raw_path", scope["path"].encode()).decode("latin-1") + (
            "?" + query.decode("latin-1") if query else "")
        headers = dict(scope.get("headers") or [])
        caller = caller_of(scope)
        try:
            assert self.secret is not None and caller is not None
            verify(self.secret, headers.get(b"authorization", b"").decode("latin-1"), scope["method"], target, body,
                   now=self.wall(), replays=self.replays, source=caller.source, recipient=caller.local or "?",
                   content_type=headers.get(b"content-type", b"").decode("latin-1"), node=self.node())
        except Refused as exc:
            self._refused(scope, str(exc))
            await closing(str(exc), 401, **{"www-authenticate": SCHEME})(scope, receive, send)
            return
        prove(scope)
        scope[SIGNED_KEY] = True
        await self.app(scope, replaying(body, receive), send)

    def _caller_refusal(self, scope: Scope) -> JSONResponse | None:
        caller = caller_of(scope)
        source = caller.source if caller is not None else "?"
        if self.secret is None:
            return closing("the control API is not open over TCP: no [api] token_file", 403)
        if caller is None or caller.peer is None:
            self._refused(scope, "not a configured peer")
            return closing(f"only this node's peers ([cluster] peers) may use /v1/* over TCP; {source} is not one",
                           403)
        if self.tls and not caller.certificate:
            self._refused(scope, "no client certificate")
            return closing(f"{source} presented no TLS certificate signed by [api] tls_ca", 403)
        return None

    def _refused(self, scope: Scope, reason: str) -> None:
        """Log a refusal, at most once a minute per source (a refused host may send thousands a second)."""
        caller = caller_of(scope)
        source = caller.source if caller is not None else "?"
        now = time.monotonic()
        if self.log is None or now - self._logged.get(source, float("-inf")) < LOG_EVERY_S:
            return
        if len(self._logged) > 1024:
            self._logged.clear()
        self._logged[source] = now
        self.log.warning("peer_request_refused", source=source, path=scope.get("path"), reason=reason,
                         note=f"further refusals of {source} are logged at most once a minute")
