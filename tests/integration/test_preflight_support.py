"""Helpers for the preflight integration tests (no tests here): real child processes with titles, sockets
and /dev/shm mappings, a view of /proc that shows only a test's own processes, and contexts.

A check run against the view sees exactly the processes the test started, so it can never signal anything
else on this machine (other sessions run stand-ins titled ``VLLM::*`` at the same time). Children are ended by
their PID through their Popen at the end of the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparkd.config import Config, config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext
from sparkd.runtime.process import ProcessRuntime

PY = sys.executable
# vLLM titles its processes <VLLM_PROCESS_NAME_PREFIX>::...; the tests' launches set this prefix, so sweeps that
# other sessions run on this machine at the same time (for VLLM::*) leave the tests' titled processes alone. It is
# the same in every session, and may be: each check that judges processes with it runs against a view of /proc
# holding only its own test's processes (the checks given the real /proc, shm and page_cache, signal nothing).
PREFIX = "VLLMPFTEST"

PRELUDE = """\
import mmap, os, signal, socket, sys, time
import setproctitle
"""


@dataclass
class Child:
    popen: subprocess.Popen[str]
    info: str  # what the child printed after "ready"
    pid: int = 0  # the child's PID (an orphan's is not its Popen's, which has exited)
    created: float = 0.0

    def process(self) -> psutil.Process | None:
        """The child, if it still runs (a PID reused since is not it)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.created) > 0.05 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.NoSuchProcess:
            return None

    def alive(self) -> bool:
        return self.process() is not None

    def cmdline(self) -> list[str]:
        return [p for p in psutil.Process(self.pid).cmdline() if p]


# An orphan's launcher forks it and exits at once; it says "ready" once it has been re-parented (to PID 1, or the
# subreaper above the test), as the engine of a vLLM whose API server was SIGKILLed is.
ORPHAN = """\
launcher = os.getpid()
if os.fork():
    os._exit(0)
while os.getppid() == launcher:
    time.sleep(0.005)
"""


class Children:
    """Starts python children and ends exactly those, by PID, when the test ends."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def __call__(self, body: str = "", *, title: str | None = None, args: tuple[str, ...] = (),
                 info: str = "''", env: dict[str, str] | None = None, orphan: bool = False) -> Child:
        """Run ``body``; with ``title`` setproctitle it first (the way vLLM titles its processes); print
        ``ready <info>`` and sleep. ``args`` end up on the child's command line (decoys mention vllm there).
        ``orphan``: the child's launcher is gone before it is ready (its parent is PID 1 or a subreaper)."""
        code = PRELUDE + (ORPHAN if orphan else "")
        if title:
            code += f"setproctitle.setproctitle({title!r})\n"
        code += textwrap.dedent(body) + f"\nprint('ready', os.getpid(), {info}, flush=True)\ntime.sleep(600)\n"
        popen = subprocess.Popen([PY, "-c", code, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 text=True, env={**os.environ, **env} if env else None)
        line = popen.stdout.readline() if popen.stdout else ""
        _, pid, info_text = (line.rstrip("\n") + " ").split(" ", 2) if line.startswith("ready") else ("", "0", "")
        child = Child(popen, info_text.strip(), int(pid))
        if child.pid:
            child.created = psutil.Process(child.pid).create_time()
        self.started.append(child)
        assert line.startswith("ready"), f"child did not start: {line!r}"
        if orphan:
            popen.wait(10)
        return child

    def end_all(self) -> None:
        orphans = [proc for proc in (c.process() for c in self.started if c.pid != c.popen.pid) if proc is not None]
        for proc in orphans:
            proc.kill()
        deadline = time.monotonic() + 10  # a zombie is gone for us: init reaps it (here, in its own time)
        while any(c.alive() for c in self.started if c.pid != c.popen.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        for child in self.started:
            if child.popen.poll() is None:
                child.popen.kill()
            child.popen.wait(10)
            if child.popen.stdout:
                child.popen.stdout.close()


@pytest.fixture
def children() -> Iterator[Children]:
    made = Children()
    yield made
    made.end_all()


def listener(children: Children, *, title: str | None = None, args: tuple[str, ...] = (),
             orphan: bool = False) -> tuple[Child, int]:
    """A child listening on a port it got by binding port 0 on 127.0.0.1."""
    child = children("""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    """, title=title, args=args, info="sock.getsockname()[1]", orphan=orphan)
    return child, int(child.info)


DECOY_ARGS = ("--comment", f"{PREFIX}::Worker_TP0 VLLM::Worker_TP0 vllm serve /models/x")  # mentions; is not


class ProcView:
    """A directory standing in for /proc: symlinks to the real /proc/<pid> of chosen processes, the real
    /proc/net, and any files a test writes (meminfo, sys/vm/*, swaps)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "net").symlink_to("/proc/net")

    def add(self, *pids: int) -> ProcView:
        for pid in pids:
            (self.root / str(pid)).symlink_to(f"/proc/{pid}")
        return self

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


@pytest.fixture
def view(tmp_path: Path) -> ProcView:
    return ProcView(tmp_path / "proc")


def config(tmp_path: Path, **sections: Any) -> Config:
    data: dict[str, Any] = {
        "runtime": "process",
        "node": {"name": "pftest", "role": "single"},
        "launch": {"executable": PY, "model": "test-org/test-model", "host": "127.0.0.1", "port": 1,
                   "env": {"VLLM_PROCESS_NAME_PREFIX": PREFIX}},
        "paths": {"state_dir": str(tmp_path / "state"), "run_dir": str(tmp_path / "run")},
        "preflight": {"kill_grace_s": 2.0},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return config_from_mapping(data, env={})


def context(tmp_path: Path, view: ProcView | None = None, *, dry_run: bool = False,
            protect: frozenset[int] = frozenset(), shm_dir: Path | None = None, **sections: Any) -> PreflightContext:
    cfg = config(tmp_path, **sections)
    return PreflightContext(
        cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path / "run"), protect=protect, dry_run=dry_run,
        proc_root=view.root if view else Path("/proc"), shm_dir=shm_dir or tmp_path / "no-shm",
    )


def write_record(cfg: Config, pid: int, create_time: float | None = None, *, marker: str | None = None) -> None:
    """The daemon's instance.json for a launch whose main process is ``pid`` (with ``marker``: the launch
    marker its identity records, as a launch by sparkd has)."""
    cfg.paths.state_dir.mkdir(parents=True, exist_ok=True)
    created = psutil.Process(pid).create_time() if create_time is None else create_time
    record: dict[str, Any] = {"runtime": "process", "pid": pid, "create_time": created, "config_hash": ""}
    if marker is not None:
        record["identity"] = {"pid": pid, "create_time": created, "marker": marker, "cmdline": []}
    (cfg.paths.state_dir / "instance.json").write_text(json.dumps(record))


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A directory of our own on the real /dev/shm tmpfs; removed with what is left in it."""
    path = Path("/dev/shm") / f"sparkd-pftest-{os.getpid()}-{os.urandom(3).hex()}"
    path.mkdir()
    yield path
    for entry in path.iterdir():
        entry.unlink()
    path.rmdir()


MAP_ONLY = """\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, 1 << 20, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
ctypes.memset(addr, 120, 1)
os.close(fd)
"""


def shm_owner(children: Children, path: Path, *, how: str = "map", args: tuple[str, ...] = ()) -> Child:
    """A child holding ``path`` (created, 1 MiB) only mapped (``map``: through libc's mmap, the descriptor
    closed — CPython's ``mmap.mmap`` would keep a dup of it) or only open (``open``)."""
    body = f"fd = os.open({str(path)!r}, os.O_CREAT | os.O_RDWR, 0o600)\nos.ftruncate(fd, 1 << 20)\n"
    body += MAP_ONLY if how == "map" else "\n"
    return children(body, args=args)


def open_paths(pid: int) -> set[str]:
    """What ``pid`` has open, as its descriptors' links read."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def leak(path: Path, size: int = 1 << 20) -> Path:
    """A segment nobody holds, with ``size`` bytes really allocated on the tmpfs."""
    with open(path, "wb") as handle:
        handle.write(b"\1" * size)
    return path
