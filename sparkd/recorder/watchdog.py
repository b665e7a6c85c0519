"""The optional hardware watchdog (``[recorder] hardware_watchdog``): a frozen host reboots by itself, with its
evidence on disk.

Once the ring has been synced, sparkd opens the watchdog device (never through a symlink), sets its timeout
(``WDIOC_SETTIMEOUT``, where the driver takes it) and pets it with a write from the daemon's live loop, only while
the supervising loop itself moves. A clean exit writes the magic ``V`` before closing, which disarms the drivers
that allow it. The risks are in docs/design.md: a sparkd that is SIGKILLed, hangs or is stopped without its clean
exit leaves the timer running, and the host reboots ``watchdog_timeout_s`` later.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
from pathlib import Path

__all__ = ["Watchdog", "WatchdogError"]

WDIOC_SETTIMEOUT = 0xC0045706  # _IOWR('W', 6, int)


class WatchdogError(OSError):
    pass


class Watchdog:
    def __init__(self, device: Path, timeout_s: int) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self.fd = -1
        self.timeout_set: int | None = None  # what the driver took (None: a plain file, or the driver refused)
        self.pets = 0

    @property
    def armed(self) -> bool:
        return self.fd >= 0

    def arm(self) -> None:
        """Open the device: from here on the host reboots unless it is petted within the timeout."""
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise WatchdogError(f"cannot open the watchdog {self.device}: {exc.strerror or exc}") from None
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            os.close(fd)
            raise WatchdogError(f"{self.device} is not a watchdog device")
        self.fd = fd
        if stat.S_ISCHR(mode):
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(fd, WDIOC_SETTIMEOUT, struct.pack("i", self.timeout_s))
                self.timeout_set = struct.unpack("i", packed)[0]
        self.pet()

    def pet(self) -> None:
        if self.fd < 0:
            return
        os.write(self.fd, b"\0")
        self.pets += 1

    def disarm(self) -> None:
        """A clean exit: the magic close (the driver stops the timer unless it was built with nowayout)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, b"V")
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
