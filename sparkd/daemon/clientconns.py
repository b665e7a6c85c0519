"""Clients waiting on vLLM's API port: the TCP connections open to it, read from ``/proc/net/tcp{,6}``. I/O only.

vLLM's gauges freeze with a wedged engine, so they cannot say whether requests wait on it; the connections can.
uvicorn closes an idle keep-alive connection after 5 s, so an established connection to the port is, all but
briefly, a request in progress (or a stream). Read only where vLLM's port is the host's (the process runtime, host
networking); elsewhere the count is unknown (None).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_clients"]

_ESTABLISHED = "01"


def open_clients(port: int, proc_root: Path = Path("/proc")) -> int | None:
    """Established connections whose local end is ``port`` (the server side of every client's connection); None
    when neither table can be read."""
    count, read = 0, False
    for table in ("tcp", "tcp6"):
        try:
            text = (proc_root / "net" / table).read_text()
        except OSError:
            continue
        read = True
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _ESTABLISHED:
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
            except (IndexError, ValueError):
                continue
    return count if read else None
