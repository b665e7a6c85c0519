"""Poll vLLM's (or the stand-in's) /health: stdlib only, so a poller process is up in milliseconds.

    python tests/bench/healthpoll.py PORT TIMEOUT   prints the monotonic time /health first answered 200, or "none"
"""

from __future__ import annotations

import http.client
import sys
import time

POLL_S = 0.01  # the bench's own /health poller


def health_ok(port: int, host: str = "127.0.0.1", timeout: float = 0.25) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_healthy(port: int, timeout: float, host: str = "127.0.0.1") -> float | None:
    """Poll /health every ~10 ms; the monotonic time of the first 200, or None at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health_ok(port, host):
            return time.monotonic()
        time.sleep(POLL_S)
    return None


if __name__ == "__main__":
    ready = wait_healthy(int(sys.argv[1]), float(sys.argv[2]))
    print("none" if ready is None else f"{ready:.6f}", flush=True)
