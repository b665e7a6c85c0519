"""parse_response: the probes' HTTP/1.x answers, whole (the server closed the connection after them)."""

from __future__ import annotations

import pytest

from sparkd.host.plainhttp import ProtocolError, parse_response

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
