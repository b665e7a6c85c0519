"""The listeners' connection policy (sparkd/api/accepting.py, bounded.py, admission.py, http11.py), against the
real server on loopback sockets in-process. Sources are told apart by their loopback address (127.0.0.N):

- every connection is counted when it is accepted, before TLS: a source that is not a peer holds at most
  ``per_source`` connections, all such sources together ``general``; a connection beyond that is closed at once,
  unanswered (tests/MUTATION.md F18);
- a peer's address gets room of its own, ``per_source`` unproven connections (the oldest evicted for a new one),
  and ``per_trusted`` reserved ones once a connection proved itself (security review §1; review 2, #10: a local
  user on the peer's host took the reserved slots by address alone);
- a connection that has not sent a whole request — headers and body — within the deadline is closed (review 2,
  #11: a body that never came held its slot forever), and so is a TLS connection that sends no ClientHello;
- the control socket knows its caller's uid (SO_PEERCRED).

tests/integration/test_peer_attacks.py floods a real pair from a third network namespace."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import ssl
import subprocess
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from sparkd.api.accepting import Doorway
from sparkd.api.admission import Limits, Pool, Slots, admit
from sparkd.api.bounded import Listener, tcp_caller, unix_caller
from sparkd.api.http11 import serve
from sparkd.api.messages import Handler, Request, Response, text
from sparkd.api.server import bind_tcp_socket, bind_unix_socket, route, routed
from sparkd.cluster.addresses import PeerAddresses

pytestmark = pytest.mark.anyio
LIMITS = Limits(general=12, per_source=4, per_trusted=5)
PEER = "127.0.0.9"


def app() -> Handler:
    async def who(request: Request) -> Response:
        caller = request.caller
        return text(f"{caller.source} trusted={caller.trusted} uid={caller.uid}" if caller else "?")

    async def proven(request: Request) -> Response:
        return text(f"proven={request.prove()}")

    async def echo(request: Request) -> Response:
        return text(f"got {len(await request.body())}")

    return routed([route("/", "GET", who), route("/prove", "GET", proven), route("/echo", "POST", echo)])


async def answer(stream: SocketStream, path: str = "/") -> bytes | None:
    """The answer to a request on ``stream``, or None when the connection was closed unanswered."""
    try:
        await stream.send(f"GET {path} HTTP/1.1\r\nHost: sparkd\r\n\r\n".encode())
        with anyio.fail_after(10):
            data = await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
        return None
    return data if data.startswith(b"HTTP/1.1 ") else None


async def connect(port: int, source: str) -> SocketStream:
    return await anyio.connect_tcp("127.0.0.1", port, local_host=source)


async def answered(streams: list[SocketStream], path: str = "/") -> list[bool]:
    results = [False] * len(streams)

    async def ask(i: int) -> None:
        results[i] = await answer(streams[i], path) is not None

    async with anyio.create_task_group() as tg:
        for i in range(len(streams)):
            tg.start_soon(ask, i)
    return results


async def closed_within(stream: SocketStream, seconds: float) -> float:
    """How long until the server closes ``stream`` (which sends nothing more)."""
    started = time.monotonic()
    with anyio.fail_after(seconds), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError)):
        while True:
            await stream.receive()
    return time.monotonic() - started


def test_admission_keeps_room_for_the_proven() -> None:
    assert admit(3, 11, trusted=False, limits=LIMITS) and not admit(4, 0, trusted=False, limits=LIMITS)
    assert not admit(0, 12, trusted=False, limits=LIMITS)  # the shared pool is full
    assert admit(4, 12, trusted=True, limits=LIMITS) and not admit(5, 0, trusted=True, limits=LIMITS)
    slots = Slots(LIMITS)
    tickets = [slots.enter(f"10.0.0.{i}", peer=False, trusted=False)[0] for i in range(12)]
    assert all(tickets) and slots.enter("10.0.0.99", peer=False, trusted=False) == (None, None)
    root, _ = slots.enter("uid:0", peer=False, trusted=True)
    assert root is not None and root.pool is Pool.reserved
    assert tickets[0] is not None
    slots.leave(tickets[0])
    slots.leave(tickets[0])  # once only
    assert slots.enter("10.0.0.99", peer=False, trusted=False)[0] is not None and slots.refused == 1
    # A peer's address: room of its own whatever the pool holds; the oldest unproven one gives way to a new one.
    waiting = [slots.enter(PEER, peer=True, trusted=False) for _ in range(LIMITS.per_source)]
    assert all(t is not None and evicted is None for t, evicted in waiting)
    newest, evicted = slots.enter(PEER, peer=True, trusted=False)
    assert newest is not None and evicted is waiting[0][0] and slots.evicted == 1
    assert slots.promote(newest) and newest.pool is Pool.reserved
    assert slots.held[(Pool.probation, PEER)] == LIMITS.per_source - 1 and slots.held[(Pool.reserved, PEER)] == 1
    assert not slots.promote(waiting[0][0])  # evicted: nothing to promote


async def test_a_flood_from_many_sources_leaves_the_peer_room_and_a_proven_peer_its_reserved_slots() -> None:
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    listener = Listener(tcp_caller(PeerAddresses([PEER])), LIMITS, first_request_s=30, next_request_s=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, listener)
        # Five sources of 6 connections each: 4 admitted per source until the pool of 12 is full.
        flood = [await connect(port, f"127.0.0.{2 + i // 6}") for i in range(30)]
        await anyio.sleep(0.2)
        # The peer's address: unproven connections live on probation, a newer one evicting the oldest...
        unproven = [await connect(port, PEER) for _ in range(LIMITS.per_source + 2)]
        await anyio.sleep(0.2)
        unproven_ok = await answered(unproven)
        # ... until one proves itself: then it holds a reserved slot that no unproven connection can take.
        proven, proven_ok = [], []
        for _ in range(LIMITS.per_trusted):  # each proves itself before the next comes (a peer's one at a time)
            proven.append(await connect(port, PEER))
            proven_ok.append((await answer(proven[-1], "/prove") or b"").endswith(b"proven=True"))
        later = [await connect(port, PEER) for _ in range(LIMITS.per_source * 3)]
        await anyio.sleep(0.2)
        still = await answered(proven)
        flood_ok = await answered(flood)
        for stream in flood + unproven + proven + later:
            await stream.aclose()
        tg.cancel_scope.cancel()
    assert flood_ok.count(True) == LIMITS.general
    assert [flood_ok[i * 6:(i + 1) * 6].count(True) for i in range(3)] == [4, 4, 4]  # per source
    assert unproven_ok == [False, False] + [True] * LIMITS.per_source  # the two oldest gave way
    assert proven_ok == [True] * LIMITS.per_trusted and still == [True] * LIMITS.per_trusted


async def test_a_queue_of_refused_connections_never_keeps_the_loop_from_other_tasks() -> None:
    """A third host's flood kept the kernel's accept queue full, and asyncio's sock_accept does not yield while it
    holds a connection: the worker's loop answered nothing else for seconds and the head lost a poll (CI, 12-07)."""
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    queued = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]  # all in the queue before it runs
    order: list[str] = []
    identify = tcp_caller(None)

    def seen(conn: socket.socket) -> object:
        order.append("accept")
        return identify(conn)

    async def other_task() -> None:
        while True:  # until the test is done
            order.append("other")
            await anyio.sleep(0)

    doorway = Doorway(sock, Slots(Limits(general=0)), seen, lambda caller, ticket: None)  # type: ignore[arg-type, return-value]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_task)
            tg.start_soon(doorway.run)
            with anyio.fail_after(10):
                while order.count("accept") < len(queued):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        for conn in queued:
            conn.close()
        sock.close()
    accepts = [i for i, what in enumerate(order) if what == "accept"]
    between = [order[a:b].count("other") for a, b in itertools.pairwise(accepts)]
    assert min(between) >= 1, order  # every accept gave the loop back before the next


async def test_a_request_must_arrive_whole_within_its_deadline() -> None:
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    # The kept connection's deadline is well past the first one's: it asks again after the other two are closed,
    # which a loaded CI machine took over a second to see (12-07: next_request_s=1.0 closed it before it asked).
    listener = Listener(tcp_caller(None), LIMITS, first_request_s=0.5, next_request_s=3.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, listener)
        opened = time.monotonic()
        silent, slow_body, prompt = [await connect(port, "127.0.0.3") for _ in range(3)]
        await slow_body.send(b"POST /echo HTTP/1.1\r\nHost: sparkd\r\nContent-Length: 60000\r\n\r\n" + b"x" * 100)
        assert await answer(prompt) is not None
        await closed_within(silent, 5)
        silent_after = time.monotonic() - opened
        await closed_within(slow_body, 5)
        slow_after = time.monotonic() - opened
        assert await answer(prompt) is not None  # a kept connection that asks again in time is still served
        await prompt.send(b"POST /echo HTTP/1.1\r\nHost: sparkd\r\nContent-Length: 10\r\n\r\nxx")
        later_after = await closed_within(prompt, 30)  # the next request's body never completes
        for stream in (silent, slow_body, prompt):
            await stream.aclose()
        with anyio.fail_after(5):
            while listener.slots.held:  # every slot is given back once its connection is gone
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    # Lower bounds: no deadline comes early; upper bounds only as far as a loaded machine allows: the first two are
    # closed by their 0.5 s deadline, not the 5 s idle timer, and the third is closed at all (its idle timer is off).
    assert 0.4 < silent_after < 4.5 and 0.4 < slow_after < 4.5 and later_after > 2.5


def self_signed(folder: Path) -> ssl.SSLContext:
    key, cert = folder / "k.pem", folder / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=sparkd"],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return context


async def test_silent_tls_connections_are_counted_before_the_handshake_and_closed_at_its_deadline(
        tmp_path: Path) -> None:
    """Review 2, #12: connections that never sent a ClientHello were not counted, each held a 256 KiB buffer for
    60 s, and 1000 of them from one address grew the daemon by 300 MB."""
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    listener = Listener(tcp_caller(None), LIMITS, handshake_s=0.6)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial_serve, sock, listener, self_signed(tmp_path))
        silent = [await connect(port, "127.0.0.4") for _ in range(LIMITS.per_source * 3)]
        await anyio.sleep(0.3)
        held_during = listener.slots.holding()
        closed = [await closed_within(stream, 5) for stream in silent[-1:]]
        for stream in silent:
            await stream.aclose()
        with anyio.fail_after(5):
            while listener.slots.held:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert held_during == LIMITS.per_source and listener.slots.refused == LIMITS.per_source * 2
    assert closed[0] < 2.0


async def test_a_burst_from_a_peers_address_keeps_no_more_than_its_unproven_room(tmp_path: Path) -> None:
    """A burst evicts connections right after their accept, before their task first runs; each is closed all
    the same (the soak found 250 sockets left open, uncounted, after such a flood)."""
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    listener = Listener(tcp_caller(PeerAddresses([PEER])), LIMITS, handshake_s=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial_serve, sock, listener, self_signed(tmp_path))
        burst = [socket.create_connection(("127.0.0.1", port), source_address=(PEER, 0)) for _ in range(60)]
        await anyio.sleep(1.0)
        still_open = 0
        for conn in burst:
            conn.setblocking(False)
            try:
                still_open += conn.recv(1) != b""
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
            conn.close()
        tg.cancel_scope.cancel()
    assert still_open == LIMITS.per_source and listener.slots.evicted == 60 - LIMITS.per_source


async def partial_serve(sock: object, listener: Listener, context: ssl.SSLContext) -> None:
    await serve(app(), sock, listener, ssl_context=context)  # type: ignore[arg-type]


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


async def test_a_server_at_rest_does_not_wake_and_each_answer_carries_this_seconds_date() -> None:
    """uvicorn's own loop woke every 0.1 s to renew its Date header once a second (two servers: 2 of an idle
    daemon's ~5 wake-ups a second); sparkd's servers wait for a connection, and the date is renewed by the request:
    at rest, no timer of theirs is due."""
    loop = asyncio.get_running_loop()
    sock = bind_tcp_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    dates, timers = [], []
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app(), sock, Listener(tcp_caller(None), LIMITS))
        for _ in range(2):
            await anyio.sleep(1.2)  # at rest, then a request in a later second
            timers += [t for t in loop._scheduled  # type: ignore[attr-defined]
                       if not t.cancelled() and "sparkd.api" in getattr(t._callback, "__module__", "")]
            stream = await connect(port, "127.0.0.5")
            head = (await answer(stream) or b"").split(b"\r\n\r\n")[0].decode()
            await stream.aclose()
            dates.append((time.time(), next(line.split(": ", 1)[1] for line in head.split("\r\n")
                                            if line.lower().startswith("date: "))))
        tg.cancel_scope.cancel()
    assert timers == []
    for asked, date in dates:
        assert abs(parsedate_to_datetime(date).timestamp() - asked) < 2.0
    assert dates[0][1] != dates[1][1]
