"""What a request must pass before a command sees it (wrappers of a :data:`sparkd.api.messages.Handler`).

- :class:`BodyLimit` (both listeners): a body is read whole before the command runs, and one over
  :data:`MAX_BODY` is answered 413 at once — by its ``Content-Length``, or when the bytes read pass the limit.
  A 300 MB body once took the daemon from 53 MB to 812 MB (security review §6).
- :class:`PeerGate` (the TCP port): ``/metrics`` is open; ``/v1/*`` is served only to a connection from a
  configured peer's address (and, with mutual TLS, one that presented a certificate chaining to ``tls_ca``), and
  only for a request signed with the shared secret by another node, for this connection's two ends and its
  Content-Type, fresh and never seen before (:mod:`sparkd.cluster.peersign`). The address and certificate are
  checked before any of the body is read. A verified request proves its connection (it moves to the peer's reserved
  room: :meth:`sparkd.api.messages.Request.prove`); every refusal closes the connection, and a signed body is read
  as JSON whatever its Content-Type says (``Request.signed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sparkd.api.messages import MAX_BODY, Handler, Request, Response, TooLarge, json_response
from sparkd.cluster.peersign import SCHEME, Refused, ReplayCache, verify
from sparkd.host.logs import Logger

LOG_EVERY_S = 60.0


def refusal(error: str, code: int, **headers: str) -> Response:
    return json_response({"ok": False, "error": error, "result": None}, code, headers)


def closing(error: str, code: int, **headers: str) -> Response:
    """A refusal that ends its connection: a client that was refused keeps no slot."""
    return refusal(error, code, connection="close", **headers)


def too_large(limit: int = MAX_BODY) -> Response:
    return refusal(f"the request body is larger than {limit // 1024} KiB", 413, connection="close")


class BodyLimit:
    def __init__(self, app: Handler, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, request: Request) -> Response:
        try:
            await request.body(self.limit)
        except TooLarge:
            return too_large(self.limit)
        return await self.app(request)


class PeerGate:
    """The TCP port's gate: ``/metrics`` for anyone, ``/v1/*`` for the peers' signed requests only."""

    def __init__(self, app: Handler, secret: str | None, *, tls: bool = False, log: Logger | None = None,
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

    async def __call__(self, request: Request) -> Response:
        if request.path == "/metrics":
            return await self.app(request)
        why = self._caller_refusal(request)
        if why is not None:
            return why
        try:
            body = await request.body()
        except TooLarge:
            return too_large()
        caller = request.caller
        try:
            assert self.secret is not None and caller is not None
            verify(self.secret, request.header("authorization"), request.method, request.target, body,
                   now=self.wall(), replays=self.replays, source=caller.source, recipient=caller.local or "?",
                   content_type=request.header("content-type"), node=self.node())
        except Refused as exc:
            self._refused(request, str(exc))
            return closing(str(exc), 401, **{"www-authenticate": SCHEME})
        request.prove()
        request.signed = True
        return await self.app(request)

    def _caller_refusal(self, request: Request) -> Response | None:
        caller = request.caller
        source = caller.source if caller is not None else "?"
        if self.secret is None:
            return closing("the control API is not open over TCP: no [api] token_file", 403)
        if caller is None or caller.peer is None:
            self._refused(request, "not a configured peer")
            return closing(f"only this node's peers ([cluster] peers) may use /v1/* over TCP; {source} is not one",
                           403)
        if self.tls and not caller.certificate:
            self._refused(request, "no client certificate")
            return closing(f"{source} presented no TLS certificate signed by [api] tls_ca", 403)
        return None

    def _refused(self, request: Request, reason: str) -> None:
        """Log a refusal, at most once a minute per source (a refused host may send thousands a second)."""
        caller = request.caller
        source = caller.source if caller is not None else "?"
        now = time.monotonic()
        if self.log is None or now - self._logged.get(source, float("-inf")) < LOG_EVERY_S:
            return
        if len(self._logged) > 1024:
            self._logged.clear()
        self._logged[source] = now
        self.log.warning("peer_request_refused", source=source, path=request.path, reason=reason,
                         note=f"further refusals of {source} are logged at most once a minute")
