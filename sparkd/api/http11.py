"""The control API's HTTP/1.1 connections: h11 parses and frames, sparkd keeps the limits
(:mod:`sparkd.api.bounded` says who is calling and for how long a connection may take to ask).

One request at a time per connection (a pipelined one waits, its bytes unread, until the answer before it is out);
keep-alive until the client closes, :data:`IDLE_TIMEOUT_S` without a byte after an answer, or a request that does
not arrive whole — headers and body — by its deadline (:attr:`Listener.first_request_s` from the connection's
opening, :attr:`Listener.next_request_s` from the previous answer). A request received whole may take as long as
its command needs. Headers over :data:`MAX_HEADER_BYTES` and anything h11 cannot parse are answered 400 and the
connection closed; a handler that fails is answered 500 and the connection closed. A streamed answer is sent
chunked, as fast as the client reads it, and ends when the client goes away. Connections are accepted through a
:class:`sparkd.api.accepting.Doorway`: admitted when accepted, before TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from http import HTTPStatus

import h11

from sparkd.api.accepting import Doorway
from sparkd.api.admission import Ticket
from sparkd.api.bounded import Caller, Listener
from sparkd.api.messages import Handler, Request, Response, text

IDLE_TIMEOUT_S = 5  # keep-alive connections with no request are closed after this
MAX_HEADER_BYTES = 64 * 1024
HIGH_WATER = 64 * 1024  # body bytes held before the connection stops reading
log = logging.getLogger("sparkd.api")


class Disconnected(Exception):
    """The client went away before its request's body was in."""


class _Cycle:
    """One request and its answer."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.whole = False  # its body is all in
        self.arrived = asyncio.Event()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class Connection(asyncio.Protocol):
    def __init__(self, app: Handler, listener: Listener, caller: Caller, ticket: Ticket) -> None:
        self.app, self.listener, self.caller, self.ticket = app, listener, caller, ticket
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.cycle: _Cycle | None = None
        self.client: str | None = None
        self.lost = False
        self.task: asyncio.Task[None] | None = None
        self.streaming = False
        self.writable = asyncio.Event()
        self.writable.set()
        self._deadline: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.ticket.close = transport.close
        name = transport.get_extra_info("peername")
        self.client = str(name[0]) if isinstance(name, tuple) and len(name) >= 2 else None
        if transport.get_extra_info("sslcontext") is not None:
            self.caller = replace(self.caller, certificate=bool(transport.get_extra_info("peercert")))
            if self.caller.peer is not None:
                if not self.caller.certificate:  # a peer's address without the peer's certificate
                    transport.close()
                    return
                self.listener.slots.promote(self.ticket)
        self._arm(self.listener.first_request_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.listener.slots.leave(self.ticket)
        for timer in (self._deadline, self._idle):
            if timer is not None:
                timer.cancel()
        if self.cycle is not None:
            self.cycle.arrived.set()
        self.writable.set()
        if self.streaming and self.task is not None:
            self.task.cancel()  # the stream's reader is gone

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self.conn.receive_data(data)
        self._handle_events()

    def _handle_events(self) -> None:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self._refuse_unparsed()
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:  # a pipelined request: read on once this answer is out
                self.transport.pause_reading()
                return
            if isinstance(event, h11.Request):
                self._start(event)
            elif isinstance(event, h11.Data) and self.conn.our_state is not h11.DONE:
                assert self.cycle is not None
                self.cycle.chunks.append(event.data)
                if sum(map(len, self.cycle.chunks)) > HIGH_WATER:
                    self.transport.pause_reading()
                self.cycle.arrived.set()
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.our_state is h11.DONE:  # the rest of a body the answer did not wait for
                    self.transport.resume_reading()
                    self.conn.start_next_cycle()
                    continue
                assert self.cycle is not None
                self.cycle.whole = True
                self.cycle.arrived.set()
                if self.conn.their_state is h11.MUST_CLOSE:
                    return

    def _start(self, event: h11.Request) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self.cycle = cycle = _Cycle()
        request = Request(event.method.decode("ascii"), event.target, event.headers, caller=self.caller,
                          client=self.client, receive=lambda: self._receive(cycle), prove=self.prove)
        self.task = asyncio.get_running_loop().create_task(self._run(request))

    def prove(self) -> bool:
        return self.listener.slots.promote(self.ticket)

    async def _receive(self, cycle: _Cycle) -> bytes | None:
        if self.conn.they_are_waiting_for_100_continue and not self.transport.is_closing():
            self._send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
        while not cycle.chunks:
            if cycle.whole:
                return None
            if self.lost:
                raise Disconnected
            cycle.arrived.clear()
            await cycle.arrived.wait()
        chunk = b"".join(cycle.chunks)
        cycle.chunks.clear()
        self.transport.resume_reading()
        return chunk

    async def _run(self, request: Request) -> None:
        try:
            response = await self.app(request)
        except Disconnected:
            return
        except Exception:
            log.exception("the control API's handler failed on %s %s", request.method, request.path)
            response = text("Internal Server Error", 500)
            response.after = self.transport.close
        try:
            if not self.lost:
                await self._respond(request, response)
        except Exception:  # a stream that failed half-way: the client sees its answer cut short
            log.exception("the control API's answer to %s %s failed", request.method, request.path)
            self.transport.close()
            return
        if response.after is not None:  # even when the client left before the answer was out
            response.after()

    async def _respond(self, request: Request, response: Response) -> None:
        headers = [*self.listener.date(), *((k.lower().encode(), v.encode()) for k, v in response.headers)]
        if response.stream is None:
            headers.append((b"content-length", str(len(response.body)).encode()))
        if response.content_type is not None:
            headers.append((b"content-type", response.content_type.encode()))
        self._send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
        head = request.method == "HEAD"
        if response.stream is not None:
            await self._stream(response.stream, head)
        elif response.body and not head:
            self._send(h11.Data(data=response.body))
        if not self.lost:
            self._send(h11.EndOfMessage())
            self._complete()

    async def _stream(self, lines: AsyncIterator[str], head: bool) -> None:
        self.streaming = True
        try:
            async for line in lines:
                if not head:
                    self._send(h11.Data(data=line.encode()))
                await self.writable.wait()
                if self.lost:
                    return
        finally:
            self.streaming = False
            close = getattr(lines, "aclose", None)
            if close is not None:
                await close()

    def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def _complete(self) -> None:
        """The answer is out: close, or wait for the next request (it may be here already)."""
        if self.conn.our_state is h11.MUST_CLOSE:
            self.transport.close()
            return
        if self.transport.is_closing():
            return
        self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self._idled)
        self._arm(self.listener.next_request_s)
        self.transport.resume_reading()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            self._handle_events()

    def _refuse_unparsed(self) -> None:
        """What h11 could not parse (or headers over MAX_HEADER_BYTES): 400, and the connection closed."""
        with contextlib.suppress(h11.LocalProtocolError):
            self._send(h11.Response(status_code=400, reason=b"Bad Request", headers=[
                (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]))
            self._send(h11.Data(data=b"Invalid HTTP request received."))
            self._send(h11.EndOfMessage())
        self.transport.close()

    def _idled(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire, self.cycle)

    def _expire(self, answered: _Cycle | None) -> None:
        """The deadline of the request after ``answered`` (None: the first): close the connection unless that
        request has arrived whole."""
        self._deadline = None
        cycle = self.cycle
        whole = cycle is not None and cycle is not answered and cycle.whole
        if not whole and not self.transport.is_closing():
            self.transport.close()


async def serve(app: Handler, sock: socket.socket, listener: Listener, *,
                ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve ``app`` on ``sock`` until cancelled: nothing wakes while no connection comes (the Date header is
    renewed by the request that needs it)."""

    def protocol_for(caller: Caller, ticket: Ticket) -> asyncio.Protocol:
        return Connection(app, listener, caller, ticket)

    await Doorway(sock, listener.slots, listener.identify, protocol_for, ssl_context=ssl_context,
                  handshake_s=listener.handshake_s).run()
