"""Stale vLLM processes: titled ``VLLM::*`` and not part of the instance being watched.

Only a process whose *title* (argv[0] after setproctitle) starts with ``VLLM::`` counts. A command line that
merely mentions vllm is never touched: ``python -c "...VLLM::Worker..."`` has argv[0] ``python``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from sparkd.runtime.proctree import running, signal_all, wait_gone

TITLE_PREFIX = "VLLM::"


def is_vllm_title(cmdline: list[str]) -> bool:
    return bool(cmdline) and cmdline[0].startswith(TITLE_PREFIX)


@dataclass(frozen=True)
class StaleProcess:
    pid: int
    cmdline: str


def find_stale(protect: Iterable[int] = ()) -> list[psutil.Process]:
    """Processes titled ``VLLM::*`` outside ``protect`` (the watched instance's tree)."""
    protected = set(protect)
    stale = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid in protected:
            continue
        cmdline = proc.info.get("cmdline") or []
        if is_vllm_title(cmdline) and running(proc):
            stale.append(proc)
    return stale


def describe(proc: psutil.Process) -> StaleProcess:
    try:
        cmdline = " ".join(part for part in proc.cmdline() if part)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmdline = "?"
    return StaleProcess(pid=proc.pid, cmdline=cmdline)


async def kill_stale(procs: list[psutil.Process], grace_s: float = 5.0) -> list[StaleProcess]:
    """SIGTERM, grace, SIGKILL. Returns what was ended, each with its PID and command line."""
    if not procs:
        return []
    found = [describe(p) for p in procs]
    signal_all(procs, signal.SIGTERM)
    if not await wait_gone(procs, grace_s):
        signal_all([p for p in procs if running(p)], signal.SIGKILL)
        await wait_gone(procs, 5.0)
    return found
