"""A real local webhook endpoint for the notifier's tests and the soak: an HTTP/1.1 server on loopback, in a thread,
that records every request and can be told to misbehave.

Modes (``endpoint.mode = ...``, changed at any time): ``ok`` answers 200; ``error`` answers 500; ``hang`` reads the
request and never answers (a slow endpoint); ``refuse`` closes each connection as soon as it is accepted. ``flaky``
cycles ok, error, hang, refuse by request. ``stop()`` closes the listener (then connections are refused).
One definition for every test folder (tests/conftest.py puts this folder on the import path).

Run as a program (``python tests/webhook_endpoint.py --port P --mode flaky --record FILE``, e.g. inside a network
namespace with ``ip netns exec``), it serves until SIGTERM, appends one JSON line per request to ``FILE``
(``at``, ``path``, ``mode``, ``body``) and keeps in ``FILE.held`` how many requests it holds unanswered now.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from freeport import free_port  # the folder is on the path when run as a program too

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
    def __init__(self, mode: str = "ok", *, hang_s: float = 3600.0, port: int | None = None,
                 record: Path | None = None) -> None:
        self.mode = mode
        self.hang_s = hang_s
        self.port = port or free_port()
        self.record = record
        self.held = 0
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
        mode: str | None = self._mode()  # a refusal happens before any request; the others take theirs per request
        with conn:
            if mode == "refuse":
                self.answered["refuse"] += 1
                return
            conn.settimeout(10)
            while not self._stop.is_set():
                request = _read_request(conn)
                if request is None:
                    return
                mode = mode or self._mode()
                if mode == "refuse":  # on a kept-alive connection: closed unanswered
                    self.answered["refuse"] += 1
                    return
                with self._lock:
                    self.received.append(request)
                    self._write(request, mode)
                if mode == "hang":
                    self.answered["hang"] += 1
                    self._holding(+1)
                    self._stop.wait(self.hang_s)
                    self._holding(-1)
                    return
                code = 200 if mode == "ok" else 500
                self.answered[mode] += 1
                body = b'{"ok":true}' if code == 200 else b"boom"
                conn.sendall(f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                mode = None

    def _write(self, request: Received, mode: str) -> None:
        if self.record is None:
            return
        line = {"at": time.time(), "path": request.path, "mode": mode, "body": request.body.decode(errors="replace")}
        with open(self.record, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def _holding(self, change: int) -> None:
        with self._lock:
            self.held += change
            if self.record is not None:
                part = self.record.with_name(self.record.name + ".held.part")
                part.write_text(str(self.held))
                os.replace(part, self.record.with_name(self.record.name + ".held"))


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


def main() -> None:
    parser = argparse.ArgumentParser(description="A webhook endpoint that records and misbehaves on request.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=(*MODES, "flaky"), default="flaky")
    parser.add_argument("--hang-s", type=float, default=20.0)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    endpoint = WebhookEndpoint(args.mode, hang_s=args.hang_s, port=args.port, record=args.record)
    done.wait()
    endpoint.stop()


if __name__ == "__main__":
    main()
