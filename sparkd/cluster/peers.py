"""The peer link: the two daemons talk HTTP over the fabric with the bearer token, with timeouts and retries."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from sparkd.cluster.shared import peer_base_url
from sparkd.config import Config


class PeerUnreachable(Exception):
    pass


class PeerClient:
    def __init__(self, cfg: Config, token: str | None) -> None:
        self.timeout_s = cfg.cluster.peer_timeout_s
        self.urls = {peer: peer_base_url(peer, cfg.api.port) for peer in cfg.cluster.peers}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(headers=headers, trust_env=False, timeout=self.timeout_s)

    @property
    def peers(self) -> list[str]:
        return list(self.urls)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, peer: str, method: str, path: str, *, retries: int = 2,
                      timeout_s: float | None = None, **kw: Any) -> dict[str, Any]:
        """JSON from the peer; PeerUnreachable after ``retries`` more tries with a short pause."""
        url = self.urls[peer] + path
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                response = await self._client.request(method, url, timeout=timeout_s or self.timeout_s, **kw)
            except httpx.TransportError as exc:
                last = exc
                if attempt < retries:
                    await anyio.sleep(0.2 * (attempt + 1))
                continue
            if response.status_code in (401, 403):
                raise PeerUnreachable(f"{peer} refused the peer token ({response.status_code})")
            data: dict[str, Any] = response.json()
            if response.status_code >= 400:
                data.setdefault("error", f"HTTP {response.status_code}")
            return data
        raise PeerUnreachable(f"sparkd on {peer} does not answer: {last}")

    async def status(self, peer: str) -> dict[str, Any]:
        return await self.request(peer, "GET", "/v1/status")
