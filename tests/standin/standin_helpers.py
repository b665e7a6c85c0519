"""Start vLLM stand-in processes for tests, collect their output, wait on conditions, clean up after them.

Each stand-in runs in its own session (``start_new_session``), so its whole tree — including children that a
SIGKILLed parent leaves behind — shares one process group led by the PID we started. Cleanup kills exactly the
PIDs we saw in that tree plus that process group, and unlinks the /dev/shm files those PIDs had mapped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
import psutil

ANSI = re.compile(r"\x1b\[[0-9;]*m")
READY_LINE = "Application startup complete."
# Other suites on this host sweep stale "VLLM::*" processes host-wide; our stand-ins use vLLM's own title-prefix
# variable to stay out of their way, except where a test asks for the real titles (title_prefix="VLLM").
TEST_TITLE_PREFIX = "VLLMTEST"


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


def mapped_shm(pid: int) -> set[str]:
    """/dev/shm paths a process has mapped (a semaphore shows under glibc's deleted temp name)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return {line.split(None, 5)[5].strip() for line in maps if " /dev/shm/" in line}
    except OSError:
        return set()


def _is_tracker(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return "multiprocessing.resource_tracker" in " ".join(psutil.Process(pid).cmdline())
    return False


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


class Standin:
    """One ``python -m sparkd_standin serve ...`` process (the installed sparkd-standin distribution) with its
    stdout+stderr collected line by line."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        startup_seconds: float = 0.5,
        title_prefix: str = TEST_TITLE_PREFIX,
    ) -> None:
        full_env = {
            **os.environ,
            "SPARKD_STANDIN_STARTUP_SECONDS": str(startup_seconds),
            "VLLM_PROCESS_NAME_PREFIX": title_prefix,
            **(env or {}),
        }
        self.title_prefix = full_env["VLLM_PROCESS_NAME_PREFIX"]
        self.argv = [sys.executable, "-m", "sparkd_standin", "serve", *args]
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
        self.pid = self.proc.pid
        self.raw = bytearray()
        self.lines: list[str] = []
        self.known_pids: set[int] = {self.pid}
        self.shm_seen: set[str] = set()
        self._cond = threading.Condition()
        self._eof = False
        self._track_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._snapshot_while_running, daemon=True).start()

    def _snapshot_while_running(self) -> None:
        """Record descendants and their /dev/shm mappings early, in case something kills them abruptly."""
        while self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.tree()
            time.sleep(0.3)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        pending = b""
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            with self._cond:
                self.raw.extend(chunk)
                pending += chunk
                *complete, pending = pending.split(b"\n")
                self.lines.extend(ANSI.sub("", line.decode(errors="replace")).replace("\r", "") for line in complete)
                self._cond.notify_all()
        with self._cond:
            if pending:
                self.lines.append(ANSI.sub("", pending.decode(errors="replace")).replace("\r", ""))
            self._eof = True  # every writer (the whole tree) has closed its end
            self._cond.notify_all()

    # -- output ---------------------------------------------------------------------------------------------
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 30.0, start: int = 0) -> re.Match[str]:
        """The first line (from index ``start``) matching the regex; fails with the output on timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    match = regex.search(line)
                    if match:
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    why = "before the output ended" if self._eof else f"within {timeout} s"
                    raise AssertionError(f"no line matching {pattern!r} {why}:\n{self.tail()}")
                self._cond.wait(min(remaining, 0.2))

    def count(self, pattern: str) -> int:
        regex = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if regex.search(line))

    def tail(self, n: int = 60) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until vLLM's ready line, then until its API port accepts: uvicorn logs the line at the end of the
        app's startup and listens a moment later (a loaded host's test connected in between and was refused)."""
        self.wait_for(re.escape(READY_LINE), timeout)
        port = self._arg("--port")
        if port is None or not port.isdigit():
            return
        host = self._arg("--host")
        address = (host if host and host not in ("0.0.0.0", "::") else "127.0.0.1", int(port))
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(address, timeout=1.0):
                return
            time.sleep(0.02)

    def _arg(self, flag: str) -> str | None:
        """The value of the last ``flag`` in the stand-in's argv (as vLLM's argparse reads it)."""
        value = None
        for i, word in enumerate(self.argv):
            if word == flag and i + 1 < len(self.argv):
                value = self.argv[i + 1]
        return value

    # -- process tree ---------------------------------------------------------------------------------------
    def tree(self) -> list[psutil.Process]:
        """The main process and its live descendants (recorded for cleanup)."""
        try:
            main = psutil.Process(self.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            mapped = mapped_shm(proc.pid)
            with self._track_lock:  # rebind, never mutate: readers may be iterating the old sets
                self.known_pids = self.known_pids | {proc.pid}
                self.shm_seen = self.shm_seen | mapped
        return procs

    def titled(self, prefix: str = "") -> dict[str, psutil.Process]:
        """Descendants whose title starts with ``prefix`` (default: this stand-in's ``<prefix>::``), by title."""
        prefix = prefix or self.title_prefix + "::"
        found = {}
        for proc in self.tree():
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if cmdline and cmdline[0].startswith(prefix):
                    found[cmdline[0]] = proc
        return found

    def group_pids(self) -> set[int]:
        """Live processes in this stand-in's process group (includes orphans whose parent died)."""
        pids = set()
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(proc.pid) == self.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    pids.add(proc.pid)
        return pids

    def send(self, sig: int) -> None:
        self.tree()
        os.kill(self.pid, sig)

    def wait_exit(self, timeout: float = 30.0, drain_s: float = 5.0) -> int:
        """The main process's exit status, once the output it and its tree wrote has been read (up to ``drain_s``
        more: a child that outlives it keeps the pipe open), so ``text()`` holds their last lines."""
        code = self.proc.wait(timeout)
        deadline = time.monotonic() + drain_s
        with self._cond:
            while not self._eof and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
        return code

    def cleanup(self) -> None:
        """SIGKILL our processes; the resource trackers go last so that they unlink the sem.mp-* files."""
        self.tree()
        with self._track_lock:
            pids = set(self.known_pids)
        pids |= self.group_pids()
        trackers = {pid for pid in pids if _is_tracker(pid)}
        for pid in pids - trackers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not any(_alive(pid) for pid in trackers), timeout=5)
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        with self._track_lock:
            seen = set(self.shm_seen)
        for path in seen:
            if os.path.basename(path).startswith("psm_"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        self._reader.join(5)


class Standins:
    """Starts stand-ins for one test and cleans all of them up afterwards."""

    def __init__(self) -> None:
        self.started: list[Standin] = []

    def start(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        startup_seconds: float = 0.5,
        title_prefix: str = TEST_TITLE_PREFIX,
    ) -> Standin:
        standin = Standin(args, env, startup_seconds, title_prefix)
        self.started.append(standin)
        return standin

    def cleanup(self) -> None:
        for standin in self.started:
            standin.cleanup()


@contextlib.contextmanager
def standins() -> Iterator[Standins]:
    group = Standins()
    try:
        yield group
    finally:
        group.cleanup()


def serving(standin: Standin, port: int) -> None:
    """Ready, and listening: uvicorn listens just after "Application startup complete."."""
    standin.wait_ready()
    wait_until(lambda: _connected(port)).close()


def _connected(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port))
    except ConnectionRefusedError:
        return None


def http(host: str, port: int, timeout: float = 10.0) -> httpx.Client:
    return httpx.Client(base_url=f"http://{host}:{port}", timeout=timeout)


def chat_body(model: str, text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def metric_value(metrics_text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample named ``name`` whose labels include ``labels``."""
    for line in metrics_text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
