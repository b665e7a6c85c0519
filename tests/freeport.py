"""A free TCP port for a test's own listener: the kernel picks one, the socket is closed before the caller binds it.

One definition for every test folder (tests/conftest.py puts this folder on the import path) and for the benches.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
