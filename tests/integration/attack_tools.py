"""What the attack tests of security review 2 share: a connection holder that runs as any user in any namespace,
the daemon's memory and descriptors, and a local user's command prefix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

PY = sys.executable
NOBODY = 65534
# A local user (not root, no group of sparkd's) that may still read the tests' Python under root's 0700 home.
LOCAL_USER = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
              "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]

# Holds COUNT connections to HOST:PORT for SECONDS, opening a new one for each the server closes (at most RATE new
# ones a second), from the given SOURCES (comma-separated local addresses, "-": any). MODE:
#   silent     TCP only, nothing sent (no TLS ClientHello either)
#   hello      the first 5 bytes of a TLS ClientHello (a record header), then nothing
#   body       "POST PATH" with Content-Length: 60000, and no body
#   tls-idle   a TLS handshake without a certificate, then nothing
#   tls-body   a TLS handshake without a certificate, then the body-less POST
# Prints one JSON line: opened, closed (by the server), refused (connect failed), held (at the end), longest (the
# longest any connection stayed open, seconds), handshake_failed.
HOLDER = """\
import json, selectors, socket, ssl, sys, time
host, port, count, seconds, mode, path, sources, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
    float(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7], float(sys.argv[8])
sources = [s for s in sources.split(",") if s and s != "-"] or [None]
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
sel, stats, end = selectors.DefaultSelector(), dict(opened=0, closed=0, refused=0, handshake_failed=0, longest=0.0), \\
    time.monotonic() + seconds
started = {}
body = f"POST {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: 60000\\r\\n\\r\\n"
def one(n):
    source = sources[n % len(sources)]
    try:
        sock = socket.create_connection((host, port), timeout=3, source_address=(source, 0) if source else None)
    except OSError:
        stats["refused"] += 1
        return
    try:
        if mode.startswith("tls"):
            sock = ctx.wrap_socket(sock, server_hostname=host)
        if mode == "hello":
            sock.sendall(b"\\x16\\x03\\x01\\x02\\x00")
        if mode.endswith("body"):
            sock.sendall(body.encode())
    except (OSError, ssl.SSLError):
        stats["handshake_failed"] += 1
        sock.close()
        return
    sock.setblocking(False)
    sel.register(sock, selectors.EVENT_READ)
    started[sock] = time.monotonic()
    stats["opened"] += 1
for n in range(count):
    one(n)
print(json.dumps({"phase": "opened", **stats}), flush=True)
n, budget, tick = count, 0.0, time.monotonic()
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.05):
        try:
            data = key.fileobj.recv(4096)
        except (ssl.SSLWantReadError, BlockingIOError):
            continue
        except (OSError, ssl.SSLError):
            data = b""
        if not data:
            sel.unregister(key.fileobj)
            stats["longest"] = max(stats["longest"], time.monotonic() - started.pop(key.fileobj))
            stats["closed"] += 1
            key.fileobj.close()
    now = time.monotonic()
    budget, tick = min(budget + (now - tick) * rate, rate), now
    while len(sel.get_map()) < count and budget >= 1 and time.monotonic() < end:
        budget -= 1
        n += 1
        one(n)
now = time.monotonic()
stats["longest"] = max([stats["longest"], *(now - t for t in started.values())])
stats["held"] = len(sel.get_map())
print(json.dumps({"phase": "end", **stats}), flush=True)
"""


def holder(prefix: list[str], host: str, port: int, count: int, seconds: float, mode: str, *, path: str = "/v1/status",
           sources: str = "-", rate: float = 50) -> subprocess.Popen[str]:
    """Start a HOLDER (``prefix``: where and as whom, e.g. ``ip netns exec NS`` + :data:`LOCAL_USER`); its first
    line says what it opened."""
    return subprocess.Popen([*prefix, PY, "-c", HOLDER, host, str(port), str(count), str(seconds), mode, path, sources,
                             str(rate)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The holder's last line, once it ended."""
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, (proc.returncode, out, err)
    return dict(json.loads(lines[-1]))


def footprint(pid: int) -> tuple[int, int]:
    """(resident memory in bytes, open descriptors) of the process."""
    proc = psutil.Process(pid)
    return proc.memory_info().rss, proc.num_fds()


def log_of(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
