"""The daemon's listening sockets, opened before anything else runs: a control socket that cannot be made or a
control port that is taken is one sentence and an exit status (``sparkd.host.exits``), never a traceback."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from sparkd.api.server import bind_tcp_socket, bind_unix_socket
from sparkd.config import Config
from sparkd.host import exits


class StartupError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Sockets:
    unix: socket.socket
    tcp: socket.socket | None


def open_sockets(cfg: Config) -> Sockets:
    try:
        unix = bind_unix_socket(cfg.paths.socket, group=cfg.api.socket_group)
    except OSError as exc:
        raise StartupError(f"cannot create the control socket {cfg.paths.socket}: {exc.strerror or exc}",
                           exits.HOST_PROBLEM) from None
    tcp = None
    if cfg.api.port:
        try:
            tcp = bind_tcp_socket(cfg.listen, cfg.api.port)
        except OSError as exc:
            unix.close()
            why = "is in use by another program" if exc.errno == 98 else f"cannot be bound: {exc.strerror or exc}"
            raise StartupError(f"[api] port {cfg.api.port} on {cfg.listen} {why}; free it or change "
                               "[api] port / listen", exits.HOST_PROBLEM) from None
    return Sockets(unix, tcp)
