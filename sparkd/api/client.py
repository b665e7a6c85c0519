"""The control API client sparkctl uses: a command over the daemon's unix socket, its envelope unwrapped.

One HTTP/1.1 request per connection (``Connection: close``) on the ``AF_UNIX`` socket, written and read here: the
daemon's server is sparkd's own on h11 (:mod:`sparkd.api.http11`), the answers are JSON with a ``Content-Length``
or a chunked stream (``logs -f``).
sparkctl asks one question a call and must answer ``status`` (or a TAB completion) in well under 150 ms, where
importing httpx took ~100 ms and ``http.client`` (with ``email`` and ``ssl``) ~30 ms on this machine (issue 28).
A transport failure (missing, refused, denied, reset, timed out, malformed) is :class:`DaemonUnreachable` with
the hint an operator needs.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, cast
from urllib.parse import urlencode

from sparkd.commands.command import query

if TYPE_CHECKING:
    from sparkd.commands.command import Command, Params

R = TypeVar("R", bound="Params")
T = TypeVar("T")


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
        import grp

        try:
            group = grp.getgrgid(os.stat(socket_path).st_gid).gr_name
        except (OSError, KeyError):
            group = "sparkd"
        return (f"permission denied on {socket_path}: join the {group!r} group (`sudo usermod -aG {group} "
                f"$USER`, then log in again) or use sudo")
    return (f"sparkd does not answer on {socket_path} ({exc}); is it running? Try `systemctl status sparkd` "
            "(or name it: --socket PATH, SPARKD_SOCKET=PATH or --config FILE)")


def _denied(exc: BaseException | None) -> bool:
    """Somewhere in the chain of causes, the socket refused us (EACCES)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EACCES or \
                "[Errno 13]" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _Malformed(OSError):
    """The daemon's answer was not the HTTP/1.1 expected."""


MAX_HEADER_LINES = 100


class _Response:
    """An answer being read: its status, headers (lower-case names) and body, read as it comes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file: BinaryIO = sock.makefile("rb")
        line = self.file.readline(65537)
        parts = line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _Malformed(f"not an HTTP answer: {line[:60]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        for _ in range(MAX_HEADER_LINES):
            line = self.file.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        else:
            raise _Malformed("too many header lines")

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (de-chunked)."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = self.file.readline(1024)
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _Malformed(f"bad chunk size {size_line[:20]!r}") from None
                if size == 0:
                    return
                data = self.file.read(size)
                self.file.readline(3)  # the CRLF after the chunk
                if len(data) < size:
                    raise _Malformed("the answer ended inside a chunk")
                yield data
        elif "content-length" in self.headers:
            yield self.file.read(int(self.headers["content-length"]))
        else:
            yield self.file.read()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class ControlClient:
    def __init__(self, socket_path: Path, *, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def close(self) -> None:
        pass  # one connection per request, closed with it

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, command: Command[R, T], request: R, timeout_s: float | None) -> _Response:
        encoded = urlencode(query(request.to_params()))
        target = command.path + (f"?{encoded}" if encoded else "")
        head = (f"{command.method} {target} HTTP/1.1\r\nHost: sparkd\r\nAccept: application/json\r\n"
                "Connection: close\r\nContent-Length: 0\r\n\r\n")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(str(self.socket_path))
            sock.sendall(head.encode("latin-1"))
            return _Response(sock)
        except (OSError, ValueError) as exc:
            sock.close()
            raise DaemonUnreachable(unreachable_hint(self.socket_path, exc)) from None

    def call(self, command: Command[R, T], request: R, *, timeout_s: float | None = None) -> T:
        """Run ``command`` with ``request``; its result, or ActionRefused."""
        response = self._request(command, request, self.timeout_s if timeout_s is None else timeout_s)
        try:
            body = b"".join(response.chunks())
        except (OSError, ValueError) as exc:
            raise DaemonUnreachable(unreachable_hint(self.socket_path, exc)) from None
        finally:
            response.close()
        try:
            envelope = json.loads(body)
        except ValueError:
            raise ActionRefused(f"the daemon answered HTTP {response.status} without JSON") from None
        if not isinstance(envelope, dict) or not envelope.get("ok"):
            error = envelope.get("error") if isinstance(envelope, dict) else None
            raise ActionRefused(error or f"HTTP {response.status}",
                                envelope.get("result") if isinstance(envelope, dict) else None)
        return cast("T", envelope.get("result"))  # the JSON the daemon sent for this command

    def stream(self, command: Command[R, T], request: R) -> Iterator[str]:
        """A streamed command's lines (``logs --follow``) as they come."""
        response = self._request(command, request, None)
        pending = b""
        try:
            for data in response.chunks():
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace").rstrip("\r")
            if pending:
                yield pending.decode("utf-8", "replace").rstrip("\r")
        except (OSError, ValueError) as exc:
            raise DaemonUnreachable(unreachable_hint(self.socket_path, exc)) from None
        finally:
            response.close()
