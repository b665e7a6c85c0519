"""A request as the control API's handlers see it, and the answer they give (:mod:`sparkd.api.http11` carries both
over HTTP/1.1).

A :class:`Request` is handed to its handler once its headers are in; its body is read when asked for
(:meth:`Request.body`), never past :data:`MAX_BODY`: a body whose ``Content-Length`` says more, or whose bytes run
past it, raises :class:`TooLarge` (a 300 MB body once took the daemon from 53 MB to 812 MB, security review §6).
A :class:`Response` is a whole body or a stream of text (``sparkctl logs -f``: chunked), and what runs once it is
sent (``after``: a hand-over exits after answering).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

if TYPE_CHECKING:
    from sparkd.api.bounded import Caller

MAX_BODY = 64 * 1024

Receive = Callable[[], Awaitable[bytes | None]]  # the body's next bytes; None once it is all in


class TooLarge(Exception):
    pass


async def _no_body() -> None:
    return None


def _never() -> bool:
    return False


class Request:
    """One request: its line and headers (names lower-case; a repeated one's last value), who sent it, and its
    body when asked for."""

    def __init__(self, method: str, target: bytes, headers: Iterable[tuple[bytes, bytes]], *,
                 caller: Caller | None = None, client: str | None = None, receive: Receive = _no_body,
                 prove: Callable[[], bool] = _never) -> None:
        self.method = method
        raw_path, _, self.query = target.partition(b"?")
        self.raw_path = raw_path
        self.path = unquote(raw_path.decode("ascii"))
        self.headers = {name.lower(): value for name, value in headers}
        self.caller = caller
        self.client = client  # the TCP source address as the socket gives it; None on the control socket
        self.signed = False  # the peer gate verified its signature: its body is JSON whatever its Content-Type
        self._receive = receive
        self._prove = prove
        self._body: bytes | None = None

    @property
    def target(self) -> str:
        """The path and query as sent (what a peer's signature covers)."""
        query = self.query.decode("latin-1")
        return self.raw_path.decode("latin-1") + ("?" + query if query else "")

    def header(self, name: str) -> str:
        return self.headers.get(name.encode(), b"").decode("latin-1")

    def params(self) -> dict[str, Any]:
        """The query's parameters (a repeated one's last value)."""
        return dict(parse_qsl(self.query.decode("latin-1"), keep_blank_values=True))

    def prove(self) -> bool:
        """The connection has proved it is a peer's (its signature verified): give it the reserved room."""
        return self._prove()

    async def body(self, limit: int = MAX_BODY) -> bytes:
        """The whole body; :class:`TooLarge` past ``limit`` (by its Content-Length or as it is read)."""
        if self._body is not None:
            return self._body
        length = self.headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise TooLarge
        chunks, size = [], 0
        while (chunk := await self._receive()) is not None:
            size += len(chunk)
            if size > limit:
                raise TooLarge
            chunks.append(chunk)
        self._body = b"".join(chunks)
        return self._body


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stream: AsyncIterator[str] | None = None  # sent chunked, as it comes
    after: Callable[[], None] | None = None  # runs in the event loop once the answer is out


Handler = Callable[[Request], Awaitable[Response]]


def json_response(content: Any, status: int = 200, headers: Mapping[str, str] | None = None, *,
                  after: Callable[[], None] | None = None) -> Response:
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return Response(status, body, "application/json", tuple((headers or {}).items()), after=after)


def text(body: str | bytes, status: int = 200, headers: Mapping[str, str] | None = None, *,
         content_type: str = "text/plain; charset=utf-8") -> Response:
    return Response(status, body.encode() if isinstance(body, str) else body, content_type,
                    tuple((headers or {}).items()))
