"""The peer link: the two daemons talk HTTP over the fabric with the bearer token, with timeouts and retries."""

from __future__ import annotations

from typing import Any

import anyio

from sparkd.cluster.shared import peer_base_url
from sparkd.config import Config
from sparkd.plainhttp import Client, ProtocolError


class PeerUnreachable(Exception):
    pass


class PeerRefused(Exception):
    """The peer's sparkd answered, and refused (``ok: false``)."""


class PeerClient:
    def __init__(self, cfg: Config, token: str | None) -> None:
        self.timeout_s = cfg.cluster.peer_timeout_s
        self.urls = {peer: peer_base_url(peer, cfg.api.port) for peer in cfg.cluster.peers}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = Client(headers=headers)  # plain HTTP between the nodes' sparkd, one connection a request

    @property
    def peers(self) -> list[str]:
        return list(self.urls)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, peer: str, method: str, path: str, *, retries: int = 2,
                      timeout_s: float | None = None, **kw: Any) -> dict[str, Any]:
        """The command's result from the peer; PeerRefused when it refused, PeerUnreachable when it did not
        answer after ``retries`` more tries with a short pause."""
        envelope = await self.envelope(peer, method, path, retries=retries, timeout_s=timeout_s, **kw)
        if not envelope.get("ok"):
            raise PeerRefused(f"{peer} refused: {envelope.get('error') or 'no reason given'}")
        result = envelope.get("result")
        return result if isinstance(result, dict) else {}

    async def envelope(self, peer: str, method: str, path: str, *, retries: int = 2,
                       timeout_s: float | None = None, **kw: Any) -> dict[str, Any]:
        """The peer's whole answer (``{"ok": …, "result": …, "error": …}``)."""
        url = self.urls[peer] + path
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                # A long request (a rank's stop, its preflight) still gives up connecting after peer_timeout_s:
                # a node cut off the fabric swallows SYNs.
                with anyio.fail_after(timeout_s or self.timeout_s):
                    response = await self._client.request(method, url, connect_timeout=self.timeout_s, **kw)
            except (OSError, TimeoutError, ProtocolError) as exc:
                last = exc
                if attempt < retries:
                    await anyio.sleep(0.2 * (attempt + 1))
                continue
            if response.status_code in (401, 403):
                raise PeerUnreachable(f"{peer} refused the peer token ({response.status_code})")
            try:
                data = response.json()
            except ValueError:
                data = None
            if not isinstance(data, dict):
                return {"ok": False, "error": f"HTTP {response.status_code} without a JSON envelope"}
            return data
        raise PeerUnreachable(f"sparkd on {peer} does not answer: {last}")

    async def status(self, peer: str) -> dict[str, Any]:
        return await self.request(peer, "GET", "/v1/status")
