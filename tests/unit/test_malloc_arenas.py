"""`sparkd run` bounds glibc's malloc arenas before it starts a thread (sparkd/daemon/boot/startup.py): eight threads
that each allocate share two arenas, where without the bound each gets its own (glibc allows 8 per core), so the
daemon's memory at rest does not grow with the host's cores. Each count runs in a fresh interpreter."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, sys, threading
from sparkd.daemon.boot.startup import bound_malloc_arenas
HEAP_MAX = 64 << 20
if sys.argv[1] == "bounded":
    assert bound_malloc_arenas({})
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
ready, hold = threading.Barrier(9), threading.Event()

def allocate():
    libc.malloc(64 << 10)  # a thread's first malloc: glibc gives it an arena
    ready.wait()
    hold.wait()

threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
heaps = 0
for line in open("/proc/self/maps"):
    start, _, rest = line.partition("-")
    perms, path = rest.split()[1], rest.split()[5:] if len(rest.split()) > 5 else []
    if not path and perms.startswith("rw") and int(start, 16) % HEAP_MAX == 0:
        heaps += 1
hold.set()
print(heaps)
"""


def arenas(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the arenas are glibc's")
def test_eight_allocating_threads_share_two_arenas_once_bounded() -> None:
    assert arenas("bounded") <= 2 < arenas("unbounded")
