"""The control listeners' connection cap (sparkd/api/bounded.py), against the real uvicorn server on a loopback
socket in-process: a connection beyond MAX_CONNECTIONS is closed at once, unanswered; the others are served
(tests/MUTATION.md F18). tests/integration/test_daemon_robust.py floods a real daemon under a descriptor limit."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import SocketStream
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sparkd.api.bounded import MAX_CONNECTIONS
from sparkd.api.server import bind_tcp_socket, serve

pytestmark = pytest.mark.anyio
EXTRA = 6


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def answered(stream: SocketStream) -> bool:
    """Whether a request on ``stream`` gets an HTTP answer (any status) rather than a closed connection."""
    try:
        await stream.send(b"GET / HTTP/1.1\r\nHost: sparkd\r\n\r\n")
        with anyio.fail_after(10):
            return (await stream.receive()).startswith(b"HTTP/1.1 ")
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
        return False


async def test_connections_beyond_the_cap_are_closed_unanswered_and_the_rest_are_served() -> None:
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app, sock)
        streams = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(MAX_CONNECTIONS + EXTRA)]
        results = [False] * len(streams)

        async def ask(i: int) -> None:
            results[i] = await answered(streams[i])

        async with anyio.create_task_group() as asking:
            for i in range(len(streams)):
                asking.start_soon(ask, i)
        for stream in streams:
            await stream.aclose()
        tg.cancel_scope.cancel()
    assert results.count(True) == MAX_CONNECTIONS and results.count(False) == EXTRA
