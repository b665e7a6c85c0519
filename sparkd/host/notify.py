"""systemd notification: READY once the loop is up, STATUS on every change, a WATCHDOG that proves progress.

READY=1 is sent when sparkd's own loop runs, not when vLLM is ready: a cold start takes minutes and must not
hit the unit's start timeout. WATCHDOG=1 goes out at half of WATCHDOG_USEC, and only while the main loop
has processed an observation recently — a wedged loop stops petting and systemd restarts sparkd.
"""

from __future__ import annotations

import os
import socket
import time

import sdnotify


class _Notifier(sdnotify.SystemdNotifier):
    """sdnotify's sender, connected to a given address instead of the process environment's."""

    def __init__(self, address: str) -> None:
        self.debug = False
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.socket.connect("\0" + address[1:] if address.startswith("@") else address)
        except OSError:
            self.socket.close()
            self.socket = None  # type: ignore[assignment]  # sdnotify treats None as "not connected"


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.enabled = bool(address)
        self._notifier = _Notifier(address) if address else None
        usec = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        for_us = not watchdog_pid or watchdog_pid == str(os.getpid())
        self.watchdog_s: float | None = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and for_us else None
        self._last_status = ""

    def send(self, *lines: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self._last_status = status
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self.send(f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    @property
    def watchdog_interval_s(self) -> float | None:
        return None if self.watchdog_s is None else self.watchdog_s / 2

    def pet(self, last_progress: float, now: float | None = None) -> bool:
        """Send WATCHDOG=1 if the loop made progress within the watchdog period. Returns whether it did."""
        if self.watchdog_s is None:
            return False
        now = time.monotonic() if now is None else now
        if now - last_progress > self.watchdog_s / 2:
            return False
        self.send("WATCHDOG=1")
        return True
