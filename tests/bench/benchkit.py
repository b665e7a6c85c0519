"""Shared parts of the benchmarks: owned processes, the /dev/shm ledger, the /health poller, statistics.

Rules every benchmark keeps (tests/bench/README.md): traffic only to loopback or our own network namespaces;
a process is ended only if this run started it (by PID, through a ``psutil.Process`` bound when it was seen,
so a reused PID is never hit); a /dev/shm file is removed only if one of our processes held it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO))

from daemon_harness import BIN, STANDIN, STANDIN_SKIPS, render_toml, unique_prefix  # noqa: E402
from freeport import free_port  # noqa: E402
from healthpoll import POLL_S, health_ok, wait_healthy  # noqa: E402, F401 (re-exported)

__all__ = ["BIN", "REPO", "STANDIN", "Owned", "ShmLedger", "free_port", "render_toml", "unique_prefix"]

SHM = Path("/dev/shm")
SHM_PATTERNS = ("psm_", "sem.mp-")
STANDIN_STARTUP_S = "3"  # the stand-in's fixed simulated load time (issue 9)
# The memory guard's floors for a 24 GiB machine shared with other work, as in config/examples/demo.toml:
# the shipped floors are for a 128 GB GB10 (refuse a start under 16 GiB, stop vLLM under 4 GiB) and would
# stop the stand-in whenever someone else's tests take memory. The guard's sampling cadence is unchanged.
GUARD_FLOORS = {"warn_below": "2 GiB", "refuse_start_below": "1 GiB", "stop_below": "768 MiB",
                "kill_below": "512 MiB"}


# ---- processes we started --------------------------------------------------------------------------------------


class Owned:
    """Every process this run started or saw in the tree of one it started, bound by PID and create time."""

    def __init__(self) -> None:
        self.procs: dict[tuple[int, float], psutil.Process] = {}

    def add_tree(self, pid: int) -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for proc in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.procs[(proc.pid, proc.create_time())] = proc
        return members

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.procs.values() if running(p)]

    def kill_all(self) -> int:
        """SIGKILL every owned process still running (psutil checks the identity before signalling)."""
        left = self.alive()
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.kill()
        psutil.wait_procs(left, timeout=5)
        return len(left)


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def end_process(popen: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM a process we started, wait, SIGKILL (by its PID; Popen knows whether it was reaped)."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(10)


# ---- /dev/shm files our processes held -------------------------------------------------------------------------


def held_by(procs: Iterable[psutil.Process]) -> set[str]:
    """psm_* / sem.mp-* names that these processes have open or mapped."""
    names: set[str] = set()
    prefix = str(SHM) + "/"
    for proc in procs:
        if not running(proc):  # also: the PID is not someone else's now (psutil compares create times)
            continue
        pid_dir = Path("/proc") / str(proc.pid)
        try:
            targets = [os.readlink(fd) for fd in (pid_dir / "fd").iterdir()]
            maps = (pid_dir / "maps").read_text(errors="replace").splitlines()
        except OSError:
            continue
        for text in [*targets, *(line.split(None, 5)[-1] for line in maps if prefix in line)]:
            if text.startswith(prefix):
                name = text[len(prefix):].removesuffix(" (deleted)")
                if name.startswith(SHM_PATTERNS):
                    names.add(name)
    return names


class ShmLedger:
    """The /dev/shm segments our processes were seen holding, in sparkd's own ledger (name and inode, files of
    the holder's uid, O_PATH descriptors not counted: sparkd.preflight.shmholders), so that the bench's cleanup
    follows sparkd's one definition of stale: at the end those still there that no live process holds go, and
    nothing else (not by naming: another program's psm_* is not the bench's)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sparkd-bench-ledger-"))
        self.path = self.folder / "shm-ledger.json"

    def note(self, procs: Iterable[psutil.Process]) -> None:
        from sparkd.preflight.shmholders import ShmLedger as Book

        Book(self.path).note([p.pid for p in procs if running(p)], SHM)

    def cleanup(self) -> int:
        """Remove the noted segments that no live process holds any more; returns how many."""
        from sparkd.preflight.shm import sweep

        try:
            return len(sweep(SHM, ledger=self.path, uids=frozenset(), complete_view=False))
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


# ---- the bench's own readiness poller ----------------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def standin_by_prefix(prefix: str, old: int | None = None) -> int | None:
    """The stand-in's API server (not one of its titled children) whose environment carries ``prefix`` as its
    VLLM_PROCESS_NAME_PREFIX: how the bench finds a stand-in that a container or a unit started."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.pid == old or not cmd or cmd[0].startswith(prefix) or "serve" not in cmd:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("VLLM_PROCESS_NAME_PREFIX") == prefix and running(proc):
                return proc.pid
    return None


def kill_delays(n: int, seed: int = 9, low: float = 0.2, high: float = 2.0) -> list[float]:
    """When to kill after ready: the same seeded random moments for every supervisor."""
    rng = random.Random(seed)
    return [round(rng.uniform(low, high), 3) for _ in range(n)]


# ---- launch settings shared by sparkd and its peers -------------------------------------------------------------


def sparkd_config(tmp: Path, port: int, env: dict[str, str], *, master_port: int | None = None,
                  api_port: int = 0, **sections: dict[str, Any]) -> dict[str, Any]:
    """A sparkd config with the shipped defaults except paths, ports and what ``sections`` override.

    With ``master_port`` the stand-in runs as the head of a two-node world on its own (tensor parallel 1, so it
    binds the master port in its worker child and waits for nobody): the field's VLLM::Worker-holds-the-port
    failure on one machine."""
    launch: dict[str, Any] = {"executable": str(STANDIN), "model": "sparkd-bench/standin",
                              "served_model_name": "bench",
                              "host": "127.0.0.1", "port": port, "env": env}
    node: dict[str, Any] = {"name": "bench", "role": "single"}
    if master_port is not None:
        node = {"name": "bench", "role": "head", "rank": 0}
        launch |= {"nnodes": 2, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": master_port}
    cfg: dict[str, Any] = {
        "runtime": "process", "node": node, "launch": launch,
        "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"),
                  "instances_dir": str(tmp / "instances")},
        "api": {"socket_group": "", "listen": "127.0.0.1", "port": api_port},
        "guard": dict(GUARD_FLOORS),
        "preflight": {"skip": STANDIN_SKIPS},  # the stand-in loads no weights (sparkd.launch.rehearsal.REHEARSAL_SKIPS)
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def rendered_launch(config_path: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and environment sparkd renders for a config: what the peers run, word for word."""
    out = subprocess.run([str(BIN / "sparkd"), "render", "--config", str(config_path), "--json"],
                         capture_output=True, text=True, check=True, timeout=60)
    data = json.loads(out.stdout)
    return list(data["argv"]), dict(data["env"])


def standin_env(prefix: str, *, orphan: bool = False, startup: str = STANDIN_STARTUP_S,
                idle_threads: int = 0) -> dict[str, str]:
    """``idle_threads``: idle threads each stand-in process keeps, as a real vLLM's processes keep torch's, NCCL's and
    CUDA's thread pools (what a supervisor's walk of the tree's tasks pays for)."""
    env = {"SPARKD_STANDIN_STARTUP_SECONDS": startup, "VLLM_PROCESS_NAME_PREFIX": prefix}
    if orphan:
        env["SPARKD_STANDIN_ORPHAN_ON_KILL"] = "1"
    if idle_threads:
        env["SPARKD_STANDIN_IDLE_THREADS"] = str(idle_threads)
    return env


# ---- statistics and formatting ----------------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return data[low] + (data[high] - data[low]) * (pos - low)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def fmt(value: float | None, spec: str = ".2f", none: str = "–") -> str:
    return none if value is None else format(value, spec)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")


def bench_parser(doc: str | None, default_json: str) -> argparse.ArgumentParser:
    """The options every bench script has: ``--json PATH`` (default: ``default_json`` in the temporary
    directory, never the checkout) and ``--keep``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--json", default=str(Path(tempfile.gettempdir()) / f"sparkd-{default_json}"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, configs)")
    return parser


def run_bench(parser: argparse.ArgumentParser, bench: Callable[[argparse.Namespace], dict[str, Any]]) -> int:
    """Parse the options, run ``bench``, write its results as JSON."""
    args = parser.parse_args()
    results = bench(args)
    write_json(args.json, results)
    log(f"(JSON: {args.json}; {results['seconds']:.0f} s)")
    return 0
