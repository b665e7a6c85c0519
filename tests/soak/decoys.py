"""Decoys planted for the soak: processes and /dev/shm segments that are not sparkd's and must never be touched.

- a live spawn-context ``multiprocessing`` lock and a live ``SharedMemory`` in the host's /dev/shm (the
  daemons' sweeps run there): glibc maps the lock under a temporary name, the trap of ecosystem.md §8;
- a plain ``sleep``; a Python process whose command line mentions the nodes' vLLM titles and ``vllm serve``.
At the end the lock must still open by its name in a new child (``spawn`` asks the decoy to start one).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from test_shm_support import DECOY

PY = sys.executable

SHM_DECOY = DECOY  # a spawn-context lock and a SharedMemory; on each input line a child takes the lock


@dataclass
class Decoys:
    folder: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    shm_owner: subprocess.Popen[str] | None = None

    def plant(self, mention: str) -> Decoys:
        script = self.folder / "shm_decoy.py"
        script.write_text(SHM_DECOY)
        self.shm_owner = self._start([PY, str(script)], stdin=True)
        assert self.shm_owner.stdout is not None
        self.segments = self.shm_owner.stdout.readline().split()
        assert len(self.segments) == 2, "the /dev/shm decoy did not start"
        self._start(["sleep", "100000"])
        self._start([PY, "-c", "import time; time.sleep(100000)", "--comment", mention])
        return self

    def _start(self, argv: list[str], stdin: bool = False) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def touched(self) -> list[str]:
        """What happened to a decoy: every sentence is a violation."""
        out = [f"decoy process {p.pid} ({' '.join(map(str, p.args))[:60]}) ended with {p.returncode}"
               for p in self.procs if p.poll() is not None]
        out += [f"decoy segment /dev/shm/{name} was removed" for name in self.segments
                if not Path("/dev/shm", name).exists()]
        return out

    def lock_still_opens_by_name(self) -> bool:
        owner = self.shm_owner
        if owner is None or owner.poll() is not None or owner.stdin is None or owner.stdout is None:
            return False
        owner.stdin.write("spawn\n")
        owner.stdin.flush()
        return owner.stdout.readline().strip() == "child 0 7"

    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def close(self) -> None:
        if self.shm_owner is not None and self.shm_owner.stdin is not None:
            with contextlib.suppress(OSError):
                self.shm_owner.stdin.close()  # it ends by itself and unlinks its segment
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.shm_owner.wait(10)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        child.kill()
                proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
