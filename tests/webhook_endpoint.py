"""A real local webhook endpoint for the notifier's tests and the soak: an HTTP/1.1 server on loopback, in a thread,
that records every request and can be told to misbehave.

Modes (``endpoint.mode = ...``, changed at any time): ``ok`` answers 200; ``error`` answers 500; ``hang`` reads the
request and never answers (a slow endpoint); ``refuse`` closes each connection as soon as it is accepted. ``flaky``
cycles ok, error, hang, refuse by request. ``stop()`` closes the listener (then connections are refused).
One definition for every test folder (tests/conftest.py puts this folder on the import path).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from freeport import free_port

__all__ = ["Received", "WebhookEndpoint"]

MODES = ("ok", "error", "hang", "refuse")


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookEndpoint:
    def __init__(self, mode: str = "ok", *, hang_s: float = 3600.0) -> None:
        self.mode = mode
        self.hang_s = hang_s
        self.port = free_port()
        self.received: list[Received] = []
        self.connections = 0
        self.answered: dict[str, int] = {m: 0 for m in MODES}
        self._flaky = itertools.cycle(MODES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", self.port), backlog=64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name=f"webhook-{self.port}", daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path == path]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def __enter__(self) -> WebhookEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _mode(self) -> str:
        with self._lock:
            return next(self._flaky) if self.mode == "flaky" else self.mode

    def _one(self, conn: socket.socket) -> None:
        mode = self._mode()
        with conn:
            if mode == "refuse":
                self.answered["refuse"] += 1
                return
            conn.settimeout(10)
            while not self._stop.is_set():
                request = _read_request(conn)
                if request is None:
                    return
                with self._lock:
                    self.received.append(request)
                if mode == "hang":
                    self.answered["hang"] += 1
                    self._stop.wait(self.hang_s)
                    return
                code = 200 if mode == "ok" else 500
                self.answered[mode] += 1
                body = b'{"ok":true}' if code == 200 else b"boom"
                conn.sendall(f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                mode = self._mode()  # the next request on this kept-alive connection
                if mode == "refuse":
                    self.answered["refuse"] += 1
                    return


def _read_request(conn: socket.socket) -> Received | None:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = conn.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return Received(method, path, headers, rest[:length])
