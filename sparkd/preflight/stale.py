"""Titled vLLM processes: how they are found, and how a stale one is ended.

A process counts by its name only through its *title* (argv[0] after setproctitle) starting with ``VLLM::``: a
command line that merely mentions vllm is never touched: ``python -c "...VLLM::Worker..."`` has argv[0]
``python``. vLLM takes the prefix from ``VLLM_PROCESS_NAME_PREFIX``; when the launch sets it, that prefix is the
one that marks our processes (:func:`title_prefix`). A title alone makes nothing stale: which titled processes
are stale and which are neighbours is :mod:`sparkd.preflight.neighbours`' one definition.

A process is signalled only through a ``psutil.Process`` bound when it was found, whose identity (PID and
create time) psutil checks before every signal, so a PID reused meanwhile is never hit.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from sparkd.preflight.base import read_cmdline, visible_pids
from sparkd.preflight.neighbours import TITLE_PREFIX, is_titled
from sparkd.runtime.proctree import running, signal_all, wait_gone

PREFIX_ENV = "VLLM_PROCESS_NAME_PREFIX"


def title_prefix(*envs: Mapping[str, str]) -> str:
    """``<VLLM_PROCESS_NAME_PREFIX>::`` from the first environment that sets it, else ``VLLM::``."""
    for env in envs:
        if env.get(PREFIX_ENV):
            return env[PREFIX_ENV] + "::"
    return TITLE_PREFIX


def is_vllm_title(cmdline: list[str], prefix: str = TITLE_PREFIX) -> bool:
    return is_titled(cmdline, prefix)


@dataclass(frozen=True)
class StaleProcess:
    pid: int
    cmdline: str


def bind(pid: int, argv: list[str]) -> psutil.Process | None:
    """The live process ``pid`` if it still shows ``argv`` (as read from the proc root), else None.

    Guards against a reused PID and against a proc root that is not this host's /proc."""
    try:
        proc = psutil.Process(pid)
        if [part for part in proc.cmdline() if part] != argv or not running(proc):
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def titled(proc_root: Path = Path("/proc"), prefix: str = TITLE_PREFIX) -> dict[int, list[str]]:
    """Every visible process titled ``VLLM::*`` (or ``prefix``), with its argv."""
    found = {}
    for pid in visible_pids(proc_root):
        argv = read_cmdline(proc_root, pid)
        if argv and is_vllm_title(argv, prefix):
            found[pid] = argv
    return found


def describe(proc: psutil.Process) -> StaleProcess:
    try:
        cmdline = " ".join(part for part in proc.cmdline() if part)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmdline = "?"
    return StaleProcess(pid=proc.pid, cmdline=cmdline)


async def end(procs: list[psutil.Process], grace_s: float = 5.0,
              kill_wait_s: float = 5.0) -> tuple[list[StaleProcess], list[StaleProcess]]:
    """SIGTERM, ``grace_s``, SIGKILL, ``kill_wait_s``: (what ended, what still runs)."""
    if not procs:
        return [], []
    found = {p.pid: describe(p) for p in procs}
    signal_all(procs, signal.SIGTERM)
    if not await wait_gone(procs, grace_s):
        signal_all([p for p in procs if running(p)], signal.SIGKILL)
        await wait_gone(procs, kill_wait_s)
    survivors = [found[p.pid] for p in procs if running(p)]
    gone = {s.pid for s in survivors}
    return [s for pid, s in found.items() if pid not in gone], survivors
