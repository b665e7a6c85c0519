"""The control API client sparkctl uses: a command over the daemon's unix socket (httpx), its envelope unwrapped."""

from __future__ import annotations

import errno
import grp
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class DaemonUnreachable(Exception):
    pass


class ActionRefused(Exception):
    """The daemon answered ``ok: false``; ``result`` is what it sent with the refusal (usually its status)."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


def unreachable_hint(socket_path: Path, exc: BaseException) -> str:
    """Why the socket cannot be used, and what to do about it."""
    if _denied(exc):
        try:
            group = grp.getgrgid(os.stat(socket_path).st_gid).gr_name
        except (OSError, KeyError):
            group = "sparkd"
        return (f"permission denied on {socket_path}: join the {group!r} group (`sudo usermod -aG {group} "
                f"$USER`, then log in again) or use sudo")
    return (f"sparkd does not answer on {socket_path} ({exc}); is it running? Try `systemctl status sparkd` "
            "(or pass --socket / --config)")


def _denied(exc: BaseException | None) -> bool:
    """Somewhere in the chain of causes, the socket refused us (EACCES): httpx wraps the OSError."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EACCES or \
                "[Errno 13]" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


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

    def call(self, command: Any, request: Any, *, timeout_s: float | None = None) -> Any:
        """Run ``command`` (a module of sparkd.commands) with ``request``; its result, or ActionRefused."""
        params = request.to_params()
        kw: dict[str, Any] = {"timeout": timeout_s} if timeout_s is not None else {}
        try:
            response = self._client.request(command.METHOD, f"/v1/{command.NAME}", params=params, **kw)
        except httpx.TransportError as exc:
            raise DaemonUnreachable(unreachable_hint(self.socket_path, exc)) from None
        try:
            envelope = response.json()
        except ValueError:
            raise ActionRefused(f"the daemon answered HTTP {response.status_code} without JSON") from None
        if not isinstance(envelope, dict) or not envelope.get("ok"):
            error = envelope.get("error") if isinstance(envelope, dict) else None
            raise ActionRefused(error or f"HTTP {response.status_code}",
                                envelope.get("result") if isinstance(envelope, dict) else None)
        return envelope.get("result")

    def stream(self, command: Any, request: Any) -> Iterator[str]:
        """A streamed command's lines (``logs --follow``) as they come."""
        try:
            with self._client.stream(command.METHOD, f"/v1/{command.NAME}", params=request.to_params(),
                                     timeout=None) as response:
                yield from response.iter_lines()
        except httpx.TransportError as exc:
            raise DaemonUnreachable(unreachable_hint(self.socket_path, exc)) from None
