"""Helpers for the /dev/shm sweep tests (no tests here): a /dev/shm of the tests' own, a private mount namespace
with a fresh tmpfs on /dev/shm, and programs run in it.

glibc names and maps POSIX semaphores under /dev/shm whatever the process's view, and multiprocessing's locks
and SharedMemory live there too, so the real thing (not a look-alike folder) is needed to show that the sweep
leaves other programs' live segments alone. Everything in that tmpfs was made by the test's processes, and
it vanishes with the namespace when the holder process ends.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

PY = sys.executable


class PrivateShm:
    """A holder process (``sleep``) owning a mount namespace whose /dev/shm is a 32 MiB tmpfs."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             "mount -t tmpfs -o size=32m,mode=1777 tmpfs /dev/shm && echo ready && exec sleep 900"],
            stdout=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline() if self.holder.stdout else ""
        assert line.strip() == "ready", f"could not make a private /dev/shm: {line!r}"
        self.started: list[subprocess.Popen[str]] = []

    @property
    def dir(self) -> Path:
        """The private /dev/shm as this (outer) process sees it."""
        return Path(f"/proc/{self.holder.pid}/root/dev/shm")

    def enter(self) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--"]

    def start(self, body: str, *, name: str = "prog") -> tuple[subprocess.Popen[str], str]:
        """Run the Python program ``body`` (a file, so spawn children can import it) in the namespace;
        returns it and the first line it prints."""
        script = self.tmp_path / f"{name}-{len(self.started)}.py"
        script.write_text(textwrap.dedent(body))
        proc = subprocess.Popen([*self.enter(), PY, str(script)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.started.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, f"{name} printed nothing (exit {proc.poll()})"
        return proc, line.strip()

    def python(self, code: str, *args: str, timeout: float = 120) -> Any:
        """Run ``code`` in the namespace and return the JSON it prints last."""
        out = subprocess.run([*self.enter(), PY, "-c", code, *args], capture_output=True, text=True,
                             timeout=timeout)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    def sweep(self, *, ledger: Path | None = None, dry_run: bool = False) -> list[str]:
        """sparkd's sweep of the namespace's /dev/shm, run inside it (the path is /dev/shm, as on a node)."""
        code = ("import json, sys; from pathlib import Path; from sparkd.preflight import shm; "
                "kw = {'ledger': Path(sys.argv[2])} if sys.argv[2] else {}; "
                "print(json.dumps([s.name for s in shm.sweep(Path('/dev/shm'), dry_run=sys.argv[1] == '1', **kw)]))")
        return sorted(self.python(code, "1" if dry_run else "0", str(ledger or "")))

    def names(self) -> set[str]:
        return {p.name for p in self.dir.iterdir()}

    def close(self) -> None:
        for proc in self.started:  # end of input: the programs end by themselves and clean up
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in [*self.started, self.holder]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5 if proc is not self.holder else 0.1)
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def private_shm(tmp_path: Path) -> Iterator[PrivateShm]:
    made = PrivateShm(tmp_path)
    try:
        yield made
    finally:
        made.close()


# A program of someone else's on the host: a spawn-context lock (glibc maps it under a temporary name) and a
# SharedMemory, both alive. On "spawn" it starts a child that takes the lock by name, and prints its exit code.
DECOY = """\
import multiprocessing as mp, sys
from multiprocessing import shared_memory

def take(lock):
    with lock:
        pass

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    segment = shared_memory.SharedMemory(create=True, size=1 << 20)
    segment.buf[0] = 7
    print("sem." + lock._semlock.name.lstrip("/"), segment.name, flush=True)
    for line in sys.stdin:
        child = ctx.Process(target=take, args=(lock,))
        child.start()
        child.join(60)
        print("child", child.exitcode, segment.buf[0], flush=True)
    segment.close()
    segment.unlink()
"""


def ask(proc: subprocess.Popen[str], line: str = "spawn") -> str:
    stdin: IO[str] | None = proc.stdin
    assert stdin is not None and proc.stdout is not None
    stdin.write(line + "\n")
    stdin.flush()
    return proc.stdout.readline().strip()
