"""sd_notify datagrams on a real socket, path and abstract forms; the watchdog pets only on progress."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sparkd.host.notify import Notifier


def listener(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + address[1:] if address.startswith("@") else address)
    sock.settimeout(2)
    return sock


@pytest.mark.parametrize("form", ["path", "abstract"])
def test_ready_status_watchdog_stopping(tmp_path: Path, form: str) -> None:
    address = str(tmp_path / "notify.sock") if form == "path" else f"@sparkd-test-{os.getpid()}"
    sock = listener(address)
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"})
    notifier.ready("starting")
    assert sock.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=starting"]
    notifier.status("starting")  # unchanged: not sent again
    notifier.status("ready, pid 7")
    assert sock.recv(4096) == b"STATUS=ready, pid 7"
    assert notifier.watchdog_interval_s == 1.0
    assert notifier.pet(last_progress=100.0, now=100.5)
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert not notifier.pet(last_progress=100.0, now=102.0), "a stuck loop must not pet the watchdog"
    notifier.stopping()
    assert sock.recv(4096).startswith(b"STOPPING=1")
    sock.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    notifier.ready("x")
    assert not notifier.pet(0.0, 0.0)


def test_watchdog_for_another_pid_is_ignored() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert notifier.watchdog_interval_s is None
