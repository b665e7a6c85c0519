"""Host process trees: identity, event-driven exit waits, and SIGTERM → grace → SIGKILL.

Docker has no API to kill an exec'd process, so every runtime stops vLLM through host PIDs. A PID alone is
not an identity (PIDs are reused): a process is "ours" only when its create_time matches the record.
"""

from __future__ import annotations

import contextlib
import os
import signal

import anyio
import psutil


def same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one created at ``create_time`` and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.05 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants (missing ones skipped)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_pids(pid: int) -> set[int]:
    return {p.pid for p in tree(pid)}


async def wait_exit(pid: int) -> None:
    """Return once ``pid`` has exited (it may be a zombie awaiting its parent's reap). Event-driven: pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


async def terminate_tree(pid: int, grace_s: float) -> list[int]:
    """SIGTERM the root, wait up to ``grace_s`` for the whole tree, SIGKILL what is left.

    Returns the PIDs that had to be killed. The root is signalled first because vLLM shuts its own
    children down in order on SIGTERM; the children get SIGKILL only if they outlive the grace.
    """
    members = tree(pid)
    if not members:
        return []
    signal_all(members[:1], signal.SIGTERM)
    if await wait_gone(members, grace_s):
        return []
    leftover = [p for p in {q.pid: q for q in [*members, *tree(pid)]}.values() if running(p)]
    signal_all(leftover, signal.SIGKILL)
    await wait_gone(leftover, 10.0)
    return [p.pid for p in leftover]


async def wait_gone(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Wait until none of ``procs`` runs (zombies count as gone: their parent reaps them)."""
    with anyio.move_on_after(timeout_s):
        while any(running(p) for p in procs):
            await anyio.sleep(0.05)
        return True
    return False


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
