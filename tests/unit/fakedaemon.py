"""A daemon's control socket that answers every connection with the same raw bytes, keeping what was asked."""

from __future__ import annotations

import socket
import threading
from pathlib import Path


class FakeDaemon:
    """A unix-socket HTTP server answering each connection with ``answer`` (raw bytes), then closing."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.path, self.answer, self.requests = path, answer, []
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(65536).decode())
                conn.sendall(self.answer)

    @property
    def request_lines(self) -> list[str]:
        return [request.split("\r\n", 1)[0] for request in self.requests]
