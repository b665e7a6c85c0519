"""The listeners' connection policy (sparkd/api/bounded.py, sparkd/api/admission.py), against the real uvicorn
server on loopback sockets in-process. Sources are told apart by their loopback address (127.0.0.N):

- a source that is not a peer holds at most ``per_source`` connections, all such sources together ``general``;
  a connection beyond that is closed at once, unanswered (tests/MUTATION.md F18);
- a peer keeps ``per_trusted`` slots of its own whatever the others hold (security review §1: a third host's
  idle connections took every slot and the head declared the worker lost);
- a connection that sends no request within the first-request deadline is closed;
- the control socket knows its caller's uid (SO_PEERCRED).

tests/integration/test_peer_attacks.py floods a real pair from a third network namespace."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sparkd.api.admission import Limits, Slots, admit
from sparkd.api.bounded import Listener, caller_of, tcp_caller, unix_caller
from sparkd.api.server import bind_tcp_socket, bind_unix_socket, serve
from sparkd.cluster.addresses import PeerAddresses

pytestmark = pytest.mark.anyio
LIMITS = Limits(general=12, per_source=4, per_trusted=5)
PEER = "127.0.0.9"


def app() -> Starlette:
    def who(request: Request) -> PlainTextResponse:
        caller = caller_of(request.scope)
        return PlainTextResponse(f"{caller.source} trusted={caller.trusted} uid={caller.uid}" if caller else "?")
    return Starlette(routes=[Route("/", who)])


async def answer(stream: SocketStream) -> bytes | None:
    """The answer to a request on ``stream``, or None when the connection was closed unanswered."""
    try:
        await stream.send(b"GET / HTTP/1.1\r\nHost: sparkd\r\n\r\n")
        with anyio.fail_after(10):
            data = await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
        return None
    return data if data.startswith(b"HTTP/1.1 ") else None


async def connect(port: int, source: str) -> SocketStream:
    return await anyio.connect_tcp("127.0.0.1", port, local_host=source)


async def answered(streams: list[SocketStream]) -> list[bool]:
    results = [False] * len(streams)

    async def ask(i: int) -> None:
        results[i] = await answer(streams[i]) is not None

    async with anyio.create_task_group() as tg:
        for i in range(len(streams)):
            tg.start_soon(ask, i)
    return results


def test_admission_keeps_room_for_the_trusted() -> None:
    assert admit(3, 11, trusted=False, limits=LIMITS) and not admit(4, 0, trusted=False, limits=LIMITS)
    assert not admit(0, 12, trusted=False, limits=LIMITS)  # the shared pool is full
    assert admit(4, 12, trusted=True, limits=LIMITS) and not admit(5, 0, trusted=True, limits=LIMITS)
    slots = Slots(LIMITS)
    assert all(slots.take(f"10.0.0.{i}", trusted=False) for i in range(12))
    assert not slots.take("10.0.0.99", trusted=False) and slots.take("10.9.9.9", trusted=True)
    slots.give("10.0.0.0", trusted=False)
    assert slots.take("10.0.0.99", trusted=False) and slots.refused == 1


async def test_a_flood_from_many_sources_leaves_the_peer_its_own_slots() -> None:
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    listener = Listener(tcp_caller(PeerAddresses([PEER])), LIMITS, first_request_s=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, listener)
        # Five sources of 6 connections each: 4 admitted per source until the pool of 12 is full.
        flood = [await connect(port, f"127.0.0.{2 + i // 6}") for i in range(30)]
        await anyio.sleep(0.2)
        peer = [await connect(port, PEER) for _ in range(LIMITS.per_trusted + 1)]
        flood_ok, peer_ok = await answered(flood), await answered(peer)
        for stream in flood + peer:
            await stream.aclose()
        tg.cancel_scope.cancel()
    assert flood_ok.count(True) == LIMITS.general
    assert [flood_ok[i * 6:(i + 1) * 6].count(True) for i in range(3)] == [4, 4, 4]  # per source
    assert peer_ok == [True] * LIMITS.per_trusted + [False]  # the peer's own slots, and no more


async def test_a_connection_that_sends_nothing_is_closed_at_the_first_request_deadline() -> None:
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    listener = Listener(tcp_caller(None), LIMITS, first_request_s=0.5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, listener)
        silent, prompt = await connect(port, "127.0.0.3"), await connect(port, "127.0.0.3")
        assert await answer(prompt) is not None
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await silent.receive()
        closed_after = time.monotonic() - started
        assert await answer(prompt) is not None  # a kept connection that asks again is still served
        await silent.aclose()
        await prompt.aclose()
        with anyio.fail_after(5):
            while listener.slots.held:  # every slot is given back once its connection is gone
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert 0.3 < closed_after < 2.0


async def test_the_control_socket_knows_its_callers_uid(tmp_path: Path) -> None:
    path = tmp_path / "sparkd.sock"
    sock = bind_unix_socket(path, group=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, Listener(unix_caller, LIMITS))
        stream = await anyio.connect_unix(str(path))
        data = await answer(stream)  # type: ignore[arg-type]
        await stream.aclose()
        tg.cancel_scope.cancel()
    assert data is not None and f"uid:{os.geteuid()} trusted={os.geteuid() == 0} uid={os.geteuid()}".encode() in data
    assert (path.stat().st_mode & 0o777) == 0o660
