"""The peer link: the daemons of a group talk HTTP/1.1 over the fabric, each request signed with the shared
secret (:mod:`sparkd.cluster.peersign`), over one kept-alive connection per peer
(:mod:`sparkd.host.keepalive`), optionally in mutual TLS (:mod:`sparkd.cluster.tls`), with timeouts and retries."""

from __future__ import annotations

import json as jsonlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlencode

import anyio

from sparkd.cluster.peersign import Ends, sign
from sparkd.cluster.shared import peer_base_url
from sparkd.cluster.tls import client_context
from sparkd.commands import status as status_command
from sparkd.commands.base import NoParams
from sparkd.commands.command import Params, query
from sparkd.config import Config
from sparkd.host.keepalive import KeepAliveClient, Signer
from sparkd.host.plainhttp import ProtocolError

if TYPE_CHECKING:
    from sparkd.commands.command import Command
    from sparkd.commands.port import Outgoing, Route
    from sparkd.commands.statusdoc import Status

R = TypeVar("R", bound=Params)
T = TypeVar("T")

MAX_ERROR = 300  # characters of a peer's refusal that reach a sentence


class PeerUnreachable(Exception):
    pass


class PeerRefused(Exception):
    """The peer's sparkd answered, and refused (``ok: false``)."""


def claim(text: object, limit: int = MAX_ERROR) -> str:
    """A peer's words, made safe to quote: one line of printable characters, at most ``limit`` of them."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def unanswered(exc: BaseException | None, timeout_s: float) -> str:
    """Why a request got no answer, in words: a timeout and a closed stream say nothing themselves."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, anyio.EndOfStream | anyio.IncompleteRead | anyio.BrokenResourceError):
        return "the connection closed before an answer"
    return claim(exc) or type(exc).__name__


def wire(command: Route, request: Outgoing) -> tuple[str, str, dict[str, object] | None]:
    """(method, path, JSON body) of ``command`` with ``request`` on the peer link: a GET's parameters in the query
    string, a POST's as the body (none when it has none)."""
    params, path = request.to_params(), command.path
    if command.method == "GET":
        encoded = urlencode(query(params))
        return command.method, path + (f"?{encoded}" if encoded else ""), None
    return command.method, path, dict(params) or None


class PeerClient:
    def __init__(self, config: Callable[[], Config], token: str | None, *,
                 wall: Callable[[], float] = time.time) -> None:
        """``config``: the config in force (its peers, port and TLS are fixed until sparkd restarts; the timeout is
        read at every request)."""
        self.config = config
        cfg = config()
        context = client_context(cfg.api)
        scheme = "https" if context is not None else "http"
        self.urls = {peer: peer_base_url(peer, cfg.api.port, scheme) for peer in cfg.cluster.peers}
        self.token = token
        self.node = cfg.node.name
        self.wall = wall
        self._client = KeepAliveClient(ssl_context=context)

    @property
    def peers(self) -> list[str]:
        return list(self.urls)

    @property
    def timeout_s(self) -> float:
        return self.config().cluster.peer_timeout_s

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, peer: str, method: str, path: str, *, retries: int = 2,
                      timeout_s: float | None = None, **kw: Any) -> dict[str, Any]:
        """The command's result from the peer; PeerRefused when it refused, PeerUnreachable when it did not
        answer after ``retries`` more tries with a short pause."""
        envelope = await self.envelope(peer, method, path, retries=retries, timeout_s=timeout_s, **kw)
        if not envelope.get("ok"):
            raise PeerRefused(f"{peer} refused: {claim(envelope.get('error') or 'no reason given')}")
        result = envelope.get("result")
        return result if isinstance(result, dict) else {}

    def _signer(self, method: str, path: str, body: bytes, content_type: str) -> Signer | None:
        """The Authorization header for the connection the request goes on (its two ends are signed)."""
        token = self.token
        if not token:
            return None

        def signed(source: str, recipient: str) -> dict[str, str]:
            ends = Ends(self.node, source, recipient)
            return {"Authorization": sign(token, method, path, body, now=self.wall(), ends=ends,
                                          content_type=content_type)}

        return signed

    async def envelope(self, peer: str, method: str, path: str, *, retries: int = 2,
                       timeout_s: float | None = None, json: object = None) -> dict[str, Any]:
        """The peer's whole answer (``{"ok": …, "result": …, "error": …}``)."""
        body = b"" if json is None else jsonlib.dumps(json, separators=(",", ":")).encode()
        content_type = "application/json" if body else ""
        headers = {"Content-Type": content_type} if body else {}
        url = self.urls[peer] + path
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                # A long request (a rank's stop, its preflight) still gives up connecting after peer_timeout_s:
                # a node cut off the fabric swallows SYNs. Each try is signed afresh (a new nonce).
                with anyio.fail_after(timeout_s or self.timeout_s):
                    response = await self._client.request(method, url, content=body, headers=headers,
                                                          signer=self._signer(method, path, body, content_type),
                                                          connect_timeout=self.timeout_s)
            except (OSError, TimeoutError, ProtocolError, anyio.EndOfStream, anyio.IncompleteRead,
                    anyio.BrokenResourceError) as exc:
                last = exc
                if attempt < retries:
                    await anyio.sleep(0.2 * (attempt + 1))
                continue
            try:
                data = response.json()
            except ValueError:
                data = None
            if response.status_code in (401, 403):
                why = data.get("error") if isinstance(data, dict) else None
                raise PeerUnreachable(f"{peer} refused this node's request ({response.status_code}: "
                                      f"{claim(why or 'no reason given')})")
            if not isinstance(data, dict):
                return {"ok": False, "error": f"HTTP {response.status_code} without a JSON envelope"}
            return data
        raise PeerUnreachable(f"sparkd on {peer} does not answer: {unanswered(last, timeout_s or self.timeout_s)}")

    async def call(self, peer: str, command: Command[R, T], request: R, *, retries: int = 2,
                   timeout_s: float | None = None) -> T:
        """``command`` on the peer, its path and method the command's own: a GET's request in the query string, a
        POST's as the JSON body (none when it has no parameters). Its result, as :meth:`request` returns it."""
        method, path, body = wire(command, request)
        result = await self.request(peer, method, path, retries=retries, timeout_s=timeout_s, json=body)
        return cast("T", result)  # the JSON the peer's sparkd sent for this command

    async def status(self, peer: str, *, retries: int = 2) -> Status:
        return await self.call(peer, status_command.COMMAND, NoParams(), retries=retries)
