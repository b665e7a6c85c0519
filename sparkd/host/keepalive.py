"""HTTP/1.1 over kept-alive connections, optionally TLS: the peer link's client.

A daemon polls each peer every ``peer_poll_s``. A fresh connection per request needs a free slot on the peer's
listener every time, and a flood of a third host's connections once took every slot (security review §1); a
connection kept open between polls needs none. Rules:

- one idle connection per origin is kept (:data:`MAX_IDLE`), for at most :data:`IDLE_S` (below the server's
  5 s keep-alive, so the server never closes one under a request); a request that finds none, or finds it
  busy, opens another, which is closed after its answer unless the idle place is free;
- an answer is read to its ``Content-Length`` or its chunked end (never more than ``max_bytes``); one without
  either ends with its connection, which is then not kept;
- a kept connection that fails before its answer begins (the server closed it meanwhile) is replaced by a fresh
  one, once; any other failure raises (``OSError``, :class:`ProtocolError`, ``anyio`` stream errors) and the
  connection is dropped;
- the caller puts the deadline around the whole request (``anyio.fail_after``); a cancelled request's
  connection is dropped, never reused.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from sparkd.host.netaddr import normalise
from sparkd.host.plainhttp import MAX_BYTES, ProtocolError, Response, parse_head

Signer = Callable[[str, str], Mapping[str, str]]

MAX_IDLE = 1
IDLE_S = 4.0
MAX_HEAD = 64 * 1024
_STREAM_ERRORS = (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError,
                  OSError)


@dataclass
class _Conn:
    stream: ByteStream
    reader: BufferedByteReceiveStream
    used_at: float

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(OSError, anyio.BrokenResourceError, ssl.SSLError):
                await self.stream.aclose()


class KeepAliveClient:
    """Requests that reuse one kept-alive connection per origin (``scheme://host:port``)."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ssl_context = ssl_context
        self.max_bytes = max_bytes
        self.clock = clock
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self.opened = 0  # connections opened so far (tests and the bench read it)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()

    async def request(self, method: str, url: str, *, content: bytes = b"", headers: Mapping[str, str] | None = None,
                      connect_timeout: float | None = None, signer: Signer | None = None) -> Response:
        """``signer``: the headers that depend on the connection the request goes on (its source address and the
        ``address:port`` it reaches), made for each connection it is sent on."""
        parts = urlsplit(url)
        want = "https" if self.ssl_context is not None else "http"
        if parts.scheme != want or not parts.hostname:
            raise ProtocolError(f"this client speaks {want}:// only, not {url!r}")
        origin = (parts.hostname, parts.port or (443 if want == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

        def data(conn: _Conn) -> bytes:
            extra = signer(*_ends(conn.stream)) if signer is not None else {}
            return _request_bytes(method, target, origin, content, {**(headers or {}), **extra})

        kept = await self._take(origin)
        if kept is not None:
            try:
                return await self._exchange(kept, origin, data(kept), method, fresh=False)
            except _Stale:
                pass
        conn = await self._connect(origin, connect_timeout)
        return await self._exchange(conn, origin, data(conn), method, fresh=True)

    async def _take(self, origin: tuple[str, int]) -> _Conn | None:
        conns = self._idle.get(origin, [])
        while conns:
            conn = conns.pop()
            if self.clock() - conn.used_at < IDLE_S:
                return conn
            await conn.aclose()
        return None

    async def _connect(self, origin: tuple[str, int], timeout: float | None) -> _Conn:
        host, port = origin
        with anyio.fail_after(timeout):
            if self.ssl_context is not None:
                stream: ByteStream = await anyio.connect_tcp(host, port, ssl_context=self.ssl_context,
                                                             tls_standard_compatible=False)
            else:
                stream = await anyio.connect_tcp(host, port)
        self.opened += 1
        return _Conn(stream, BufferedByteReceiveStream(stream), self.clock())

    async def _exchange(self, conn: _Conn, origin: tuple[str, int], data: bytes, method: str, *,
                        fresh: bool) -> Response:
        keep = False
        try:
            try:
                await conn.stream.send(data)
                head = await conn.reader.receive_until(b"\r\n\r\n", MAX_HEAD)
            except _STREAM_ERRORS as exc:
                if not fresh:
                    raise _Stale from exc
                raise
            response, keep = await self._body(conn, head, method)
            return response
        except anyio.DelimiterNotFound:
            raise ProtocolError(f"the answer's headers are larger than {MAX_HEAD} bytes") from None
        finally:
            if keep and len(self._idle.get(origin, [])) < MAX_IDLE:
                conn.used_at = self.clock()
                self._idle.setdefault(origin, []).append(conn)
            else:
                await conn.aclose()

    async def _body(self, conn: _Conn, head: bytes, method: str) -> tuple[Response, bool]:
        status, headers = parse_head(head)
        keep = headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Response(status, b"", headers), keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return Response(status, await self._chunks(conn.reader), headers), keep
        length = headers.get("content-length", "")
        if length.isdigit():
            if int(length) > self.max_bytes:
                raise ProtocolError(f"the answer is larger than {self.max_bytes} bytes")
            return Response(status, await conn.reader.receive_exactly(int(length)), headers), keep
        return Response(status, await self._to_end(conn.reader), headers), False

    async def _chunks(self, reader: BufferedByteReceiveStream) -> bytes:
        out: list[bytes] = []
        total = 0
        while True:
            line = await reader.receive_until(b"\r\n", 1024)
            try:
                size = int(line.split(b";")[0], 16)
            except ValueError:
                raise ProtocolError("malformed chunk size") from None
            if size == 0:
                while await reader.receive_until(b"\r\n", MAX_HEAD):
                    pass  # trailers, up to the empty line
                return b"".join(out)
            total += size
            if total > self.max_bytes:
                raise ProtocolError(f"the answer is larger than {self.max_bytes} bytes")
            out.append(await reader.receive_exactly(size))
            await reader.receive_exactly(2)

    async def _to_end(self, reader: BufferedByteReceiveStream) -> bytes:
        out: list[bytes] = []
        total = 0
        while True:
            try:
                chunk = await reader.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return b"".join(out)
            total += len(chunk)
            if total > self.max_bytes:
                raise ProtocolError(f"the answer is larger than {self.max_bytes} bytes")
            out.append(chunk)


def _ends(stream: ByteStream) -> tuple[str, str]:
    """(this end's address, the other end's ``address:port``) of a connection, IPv4-mapped IPv6 as IPv4."""
    local = stream.extra(SocketAttribute.local_address, ("?", 0))
    remote = stream.extra(SocketAttribute.remote_address, ("?", 0))
    return normalise(str(local[0])), f"{normalise(str(remote[0]))}:{remote[1]}"


class _Stale(Exception):
    """A kept connection the server had closed: the request goes again on a fresh one."""


def _request_bytes(method: str, target: str, origin: tuple[str, int], content: bytes,
                   headers: Mapping[str, str]) -> bytes:
    host, port = origin
    host = f"[{host}]" if ":" in host else host
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Accept: */*"]
    merged = dict(headers)
    if content or method not in ("GET", "HEAD"):
        merged["Content-Length"] = str(len(content))
    lines += [f"{name}: {value}" for name, value in merged.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content
