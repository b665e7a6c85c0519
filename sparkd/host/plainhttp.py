"""One plain HTTP/1.1 request on a fresh TCP connection: what the probes need of an HTTP client, and no more.

The probes ask vLLM's API server on this node (or a peer's sparkd) a handful of questions a minute, over plain
HTTP. A general client costs a daemon at rest more than the questions do (httpx: ~1 ms of CPU a request, a
failed ``import sniffio`` with its path search on every request, 2-3 MiB imported and a CA bundle loaded per
client). Rules:

- one connection per request, ``Connection: close``: nothing is kept alive (uvicorn drops idle connections
  after 5 s, which races a 5 s probe interval);
- no proxy, no TLS, no redirects, no cookies; the body is read to its ``Content-Length``, its chunked end, or
  the connection's end, and at most ``max_bytes`` of it (a larger answer is a protocol error);
- a refused connection, a reset and a malformed answer raise (``OSError``, :class:`ProtocolError`); the caller
  puts the one deadline around the whole request (connect, send, read);
- the socket is the kernel's, driven by the loop's readiness waits (``anyio.wait_readable``/``wait_writable``):
  no anyio stream, no asyncio transport, and the addresses tried one after another. ``anyio.connect_tcp`` races
  them in a task group (happy eyeballs) and cancels the losers from a task, which formats that task's repr: at two
  requests every 5 s that was the largest single cost of a daemon at rest (``tests/bench/README.md``).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio

MAX_BYTES = 16 * 1024 * 1024  # a vLLM /metrics page is ~100 KiB


class ProtocolError(Exception):
    """The server's answer was not HTTP/1.x as expected (or larger than allowed)."""


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class Client:
    """Requests with the same default headers; ``aclose`` and ``async with`` for symmetry (nothing is pooled)."""

    def __init__(self, *, headers: Mapping[str, str] | None = None, max_bytes: int = MAX_BYTES) -> None:
        self.headers = dict(headers or {})
        self.max_bytes = max_bytes

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        return None

    async def request(self, method: str, url: str, *, json: object = None,
                      headers: Mapping[str, str] | None = None, timeout: float | None = None,
                      connect_timeout: float | None = None) -> Response:
        """``connect_timeout``: give up connecting after this long (TimeoutError). The whole request's deadline
        is the caller's (``anyio.fail_after``); ``timeout`` is accepted for symmetry and not used."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ProtocolError(f"only plain http:// URLs are supported, not {url!r}")
        port = parts.port or 80
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        body = b"" if json is None else _json_bytes(json)
        lines = [f"{method} {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                 f"Host: {host}:{port}", "Connection: close", "Accept: */*"]
        merged = {**self.headers, **(headers or {})}
        if json is not None:
            merged.setdefault("Content-Type", "application/json")
        if body or method not in ("GET", "HEAD"):
            merged["Content-Length"] = str(len(body))
        lines += [f"{name}: {value}" for name, value in merged.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        with anyio.fail_after(connect_timeout):
            sock = await connect(parts.hostname, port)
        try:
            await _send_all(sock, request)
            raw = await _read_all(sock, self.max_bytes)
        finally:
            sock.close()
        return parse_response(raw)


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to ``host`` (an address, or a name resolved off the loop), its
    addresses tried in order; the last one's error is raised (``ConnectionRefusedError`` where nothing listens)."""
    try:
        addresses = [(socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET, (host, port))]
    except ValueError:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [(family, address) for family, _, _, _, address in infos]
    error: OSError = OSError(f"{host!r} has no address")
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EAGAIN):
                if not _connected(sock):  # a loopback handshake is done by now: no wait, no wake-up
                    await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code == 0:
                return sock
            error = OSError(code, f"Connect call failed {address}")  # the errno's own subclass, as asyncio's
        except BaseException:
            sock.close()
            raise
        sock.close()
    raise error


def _connected(sock: socket.socket) -> bool:
    """Whether a non-blocking connect has completed already (refused or still in progress: False)."""
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await anyio.wait_writable(sock)


async def _read_all(sock: socket.socket, limit: int) -> bytes:
    """The answer: until it is whole by its own framing (``Content-Length``, the chunked body's last chunk) or the
    server closes (a reset ends it too: what came before it is parsed). Not waiting for the close once the answer
    is whole spares a resting daemon's probes a wake-up each."""
    data, ends = bytearray(), _AnswerEnd()
    while True:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        except ConnectionError:
            break
        if not chunk:
            break
        data += chunk
        if len(data) > limit + 65536:
            raise ProtocolError(f"the answer is larger than {limit} bytes")
        if ends.whole(data):
            break
    return bytes(data)


class _AnswerEnd:
    """Whether the bytes read so far hold a whole answer, by its framing; without a length or a chunked body, only
    the server's close ends it. The head is parsed once it is in."""

    def __init__(self) -> None:
        self.body_at: int | None = None
        self.length: int | None = None
        self.chunked = False

    def whole(self, data: bytearray) -> bool:
        if self.body_at is None:
            end = data.find(b"\r\n\r\n")
            if end == -1:
                return False
            self.body_at = end + 4
            try:
                code, headers = parse_head(bytes(data[:end]))
            except ProtocolError:
                return False  # read on to the close: parse_response says what is wrong
            self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            if code in (204, 304):
                self.length = 0
            elif not self.chunked and headers.get("content-length", "").isdigit():
                self.length = int(headers["content-length"])
        if self.length is not None:
            return len(data) - self.body_at >= self.length
        return self.chunked and data.endswith(b"\r\n0\r\n\r\n") and _last_chunk_read(bytes(data[self.body_at:]))


def _last_chunk_read(body: bytes) -> bool:
    """Whether a chunked body that ends like its last chunk is one (a chunk's data may end so, by chance)."""
    try:
        _dechunk(body)
    except ProtocolError:
        return False
    return True


def parse_response(raw: bytes) -> Response:
    """A whole HTTP/1.x response (the connection closed after it) → status, headers, decoded body."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ProtocolError("the server closed the connection before the end of the headers" if raw else
                            "the server closed the connection without answering")
    code, headers = parse_head(head)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(rest)
    elif headers.get("content-length", "").isdigit():
        length = int(headers["content-length"])
        if len(rest) < length:
            raise ProtocolError(f"the body ended after {len(rest)} of {length} bytes")
        body = rest[:length]
    else:
        body = rest
    return Response(code, body, headers)


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """An answer's status line and headers (without the empty line that ends them) → status, lower-case headers."""
    status_line, *header_lines = head.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    version, _, tail = status_line.partition(" ")
    code = tail.partition(" ")[0]
    if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise ProtocolError(f"malformed header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(code), headers


def _dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end == -1:
            raise ProtocolError("a chunked body ended without its last chunk")
        try:
            size = int(data[pos:end].split(b";")[0], 16)
        except ValueError:
            raise ProtocolError("malformed chunk size") from None
        if size == 0:
            return b"".join(out)
        start = end + 2
        if len(data) < start + size:
            raise ProtocolError("a chunk ended early")
        out.append(data[start:start + size])
        pos = start + size + 2
