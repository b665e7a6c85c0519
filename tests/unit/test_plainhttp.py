"""parse_response: the probes' HTTP/1.x answers, whole (the server closed the connection after them); the client
over real loopback sockets."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from taskcount import tasks_started

from sparkd.host.plainhttp import Client, ProtocolError, Response, parse_response

OK = [
    ("content-length", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 200, b"ok"),
    ("chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n3;x=y\r\ncde\r\n0\r\n\r\n", 200,
     b"abcde"),
    ("to the connection's end", b"HTTP/1.0 503 Service Unavailable\r\nServer: x\r\n\r\nbusy", 503, b"busy"),
    ("no body", b"HTTP/1.1 204 No Content\r\n\r\n", 204, b""),
]
BAD = [
    ("nothing at all", b"", "without answering"),
    ("headers cut", b"HTTP/1.1 200 OK\r\nContent-Le", "before the end of the headers"),
    ("not HTTP", b"garbage\r\n\r\n", "not an HTTP/1.x status line"),
    ("body short of its length", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "ended after 3 of 10"),
    ("chunked without its end", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "chunk ended early"),
    ("header without a colon", b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n", "malformed header line"),
]


@pytest.mark.parametrize(("case", "raw", "status", "body"), OK, ids=[c[0] for c in OK])
def test_answers(case: str, raw: bytes, status: int, body: bytes) -> None:
    response = parse_response(raw)
    assert (response.status_code, response.content) == (status, body)


@pytest.mark.parametrize(("case", "raw", "why"), BAD, ids=[c[0] for c in BAD])
def test_malformed_answers_are_protocol_errors(case: str, raw: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        parse_response(raw)


# ---- the client against real sockets on loopback -----------------------------------------------------------------
class _Server:
    """A listening socket on 127.0.0.1 whose one connection ``answer(conn)`` handles in a thread."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer: Callable[[socket.socket], None]) -> None:
        conn, _ = self.sock.accept()
        with conn:
            answer(conn)
        self.sock.close()

    def read_request(self, conn: socket.socket) -> None:
        head, _, body = b"", b"", b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        head, _, body = head.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(1 << 20)
        self.received = head + b"\r\n\r\n" + body


def _request(url: str, *, within_s: float = 60, **kwargs: Any) -> Response:
    async def main() -> Response:
        with anyio.fail_after(within_s):
            return await Client().request("POST" if "json" in kwargs else "GET", url, **kwargs)
    return anyio.run(main)


def test_a_large_body_goes_out_whole_and_the_answer_comes_back_whole() -> None:
    """4 MiB out (more than a socket buffer takes at once: the send waits for room) and 3 MiB back in pieces."""
    answer = b"x" * (3 << 20)

    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)

    server = _Server(serve)
    body = {"blob": "y" * (4 << 20)}
    response = _request(f"http://127.0.0.1:{server.port}/v1/x", json=body)
    assert (response.status_code, response.content) == (200, answer)
    assert server.received.endswith(json.dumps(body, separators=(",", ":")).encode())
    assert b"Connection: close" in server.received


def test_a_host_name_is_resolved() -> None:
    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    server = _Server(serve)
    assert _request(f"http://localhost:{server.port}/health").status_code == 204  # ::1 refused first, if tried


def test_nothing_listening_is_connection_refused_naming_the_address() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening
        with pytest.raises(ConnectionRefusedError, match=rf"Connect call failed \('127\.0\.0\.1', {port}\)"):
            _request(f"http://127.0.0.1:{port}/health")


def test_a_reset_after_a_whole_answer_still_reads_it() -> None:
    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close → RST

    server = _Server(serve)
    server.thread.join(timeout=0)  # the reset may come before or after the client's first read
    assert _request(f"http://127.0.0.1:{server.port}/").content == b"ok"


def test_a_request_starts_no_task() -> None:
    """The cost a resting daemon pays per probe: no task is spawned (anyio's connect_tcp spawned one per address
    and cancelled it from a task, formatting that task's repr)."""

    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    server = _Server(serve)

    async def main() -> tuple[int, Response]:
        return await tasks_started(lambda: Client().request("GET", f"http://127.0.0.1:{server.port}/health"))

    started, response = anyio.run(main)
    assert response.status_code == 200
    assert started == 0


WHOLE = [
    ("content-length", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
    ("chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"hello"),
    ("no body", b"HTTP/1.1 204 No Content\r\n\r\n", b""),
]


@pytest.mark.parametrize(("case", "answer", "body"), WHOLE, ids=[c[0] for c in WHOLE])
def test_a_whole_answer_is_read_without_waiting_for_the_close(case: str, answer: bytes, body: bytes) -> None:
    """A resting daemon's probe wakes once for its answer, not once more for the server's close: the answer is
    whole by its framing, and the server here keeps the connection open until the client has its answer."""
    got = threading.Event()

    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(answer)
        got.wait(10)  # the connection stays open: only the framing can end the read

    server = _Server(serve)
    try:
        response = _request(f"http://127.0.0.1:{server.port}/x", within_s=5)
    finally:
        got.set()
    assert response.content == body


def test_a_chunk_that_ends_like_the_last_one_is_read_past() -> None:
    """A chunk's data that happens to end with the last chunk's bytes, at the end of one read, is not the end."""
    first = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab\r\n0\r\n\r\n"
    rest = b"\r\n2\r\nyz\r\n0\r\n\r\n"
    sent = threading.Event()

    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(first)
        sent.wait(0.3)  # the client reads the first part alone
        conn.sendall(rest)

    server = _Server(serve)
    response = _request(f"http://127.0.0.1:{server.port}/x", within_s=5)
    assert response.content == b"ab\r\n0\r\n\r\nyz"


def test_a_loopback_connection_is_used_without_waiting_to_be_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loopback handshake is done when connect returns: the probe sends at once, without a readiness wait (a
    loop turn and a wake-up each, 32 a minute at rest); a refused one still waits and names the address (above)."""
    waits: list[object] = []
    real = anyio.wait_writable

    async def counted(sock: object) -> None:
        waits.append(sock)
        await real(sock)  # type: ignore[arg-type]

    monkeypatch.setattr(anyio, "wait_writable", counted)

    def serve(conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = _Server(serve)
    assert _request(f"http://127.0.0.1:{server.port}/health").content == b"ok"
    assert waits == []
