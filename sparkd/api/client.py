"""The control API client sparkctl uses: HTTP over the daemon's unix socket (httpx)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class DaemonUnreachable(Exception):
    pass


class ActionRefused(Exception):
    def __init__(self, message: str, status: dict[str, Any] | None) -> None:
        super().__init__(message)
        self.status = status


class ControlClient:
    def __init__(self, socket_path: Path, *, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self._client = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)),
                                    base_url="http://sparkd", timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise DaemonUnreachable(f"sparkd does not answer on {self.socket_path}: {exc}") from None

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self._request("GET", "/v1/status").json()
        return data

    def action(self, name: str, *, local: bool = False) -> dict[str, Any]:
        response = self._request("POST", f"/v1/{name}", params={"local": "1"} if local else None)
        data: dict[str, Any] = response.json()
        if response.status_code != 200:
            raise ActionRefused(data.get("error", response.text), data.get("status"))
        return data

    def incidents(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._request("GET", "/v1/incidents").json()
        return data

    def preflight(self, *, dry_run: bool) -> dict[str, Any]:
        response = self._request("POST", "/v1/preflight", params={"dry_run": "1" if dry_run else "0"},
                                 timeout=600)
        data: dict[str, Any] = response.json()
        if response.status_code != 200:
            raise ActionRefused(data.get("error", response.text), None)
        return data

    def incident(self, name: str) -> dict[str, Any] | None:
        response = self._request("GET", f"/v1/incidents/{name}")
        if response.status_code == 404:
            return None
        data: dict[str, Any] = response.json()
        return data

    def logs(self, lines: int, follow: bool) -> Iterator[str]:
        params = {"lines": str(lines), "follow": "1" if follow else "0"}
        try:
            with self._client.stream("GET", "/v1/logs", params=params, timeout=None) as response:
                yield from response.iter_lines()
        except httpx.TransportError as exc:
            raise DaemonUnreachable(f"sparkd does not answer on {self.socket_path}: {exc}") from None
