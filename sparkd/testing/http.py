"""An httpx transport that hands each request to a control API handler in-process (what httpx's ASGI transport
was to an ASGI app): the handlers' answers as a client sees them, without a socket. The connection's own work
(parsing, deadlines, slots) is :mod:`sparkd.api.http11`'s, tested over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from sparkd.api.bounded import Caller
from sparkd.api.messages import Handler, Request


class HandlerTransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Handler, caller: Caller | None = None, client: str | None = "127.0.0.1") -> None:
        self.app = app
        self.caller = caller
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        chunks = aiter(request.stream)  # type: ignore[arg-type]

        async def receive() -> bytes | None:  # the body as the client sends it, chunk by chunk
            return await anext(chunks, None)

        target = request.url.raw_path
        ours = Request(request.method, target, [(k.lower(), v) for k, v in request.headers.raw],
                       caller=self.caller, client=self.client, receive=receive)
        response = await self.app(ours)
        headers = [(k, v) for k, v in response.headers]
        if response.content_type is not None:
            headers.append(("content-type", response.content_type))
        if response.stream is None:
            content = b"" if request.method == "HEAD" else response.body
            answer = httpx.Response(response.status, headers=headers, content=content)
        else:
            answer = httpx.Response(response.status, headers=headers, stream=_Lines(response.stream))
        if response.after is not None:
            response.after()
        return answer


class _Lines(httpx.AsyncByteStream):
    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.lines = lines

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for line in self.lines:
            yield line.encode()
