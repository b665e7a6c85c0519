"""The process table the stale/neighbour decision judges (:mod:`sparkd.preflight.neighbours`), read from /proc.

For each PID asked and every ancestor of it: the parent, argv (a setproctitle title is argv[0]), the real uid,
whether it is a zombie, its create time, its PID namespace, whether it is the init of its own namespace, the
launch marker its environment carries, and its session.
Everything is read through ``proc_root``, so a test's view of /proc holding only its own processes (and the
parents it chose to show) is all a check can judge.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from sparkd.preflight.base import read_cmdline
from sparkd.preflight.neighbours import Proc
from sparkd.runtime.proctree import MARKER_ENV

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def read_proc(proc_root: Path, pid: int, boot_time: float | None = None) -> Proc | None:
    """``pid`` as the decision sees it, or None when it is gone (or not in the view)."""
    base = proc_root / str(pid)
    try:
        status = _status((base / "status").read_text(errors="replace"))
        stat = (base / "stat").read_bytes()
    except OSError:
        return None
    argv = read_cmdline(proc_root, pid) or []
    try:
        ppid = int(status.get("PPid", "0"))
        fields = stat.rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22, counted after the ")" that ends the command name
        sid = int(fields[3])  # field 6: the session
    except (ValueError, IndexError):
        return None
    uids = status.get("Uid", "").split()
    nspids = status.get("NSpid", "").split()
    pid_ns = pid_namespace(pid, proc_root)
    if pid_ns is None and len(nspids) == 1:
        pid_ns = _root_namespace(proc_root)
    boot = psutil.boot_time() if boot_time is None else boot_time
    return Proc(pid=pid, ppid=ppid, argv=tuple(argv), start=boot + ticks / CLOCK_TICKS,
                uid=int(uids[0]) if uids and uids[0].isdigit() else None,
                zombie=status.get("State", "").startswith(("Z", "X")), pid_ns=pid_ns,
                ns_init=len(nspids) > 1 and nspids[-1] == "1", marker=read_marker(base / "environ"),
                sid=sid or None)


def read_marker(environ: Path) -> str | None:
    """The launch marker (SPARKD_LAUNCH_ID) in a process's environment; None when it has none or it cannot be
    read (not root, or the memory overwritten by a long process title)."""
    try:
        raw = environ.read_bytes()
    except OSError:
        return None
    prefix = MARKER_ENV.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace") or None
    return None


def table(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, Proc]:
    """The processes ``pids`` and all their ancestors that ``proc_root`` shows."""
    boot = psutil.boot_time()
    out: dict[int, Proc] = {}
    todo = [pid for pid in pids if pid > 0]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        proc = read_proc(proc_root, pid, boot)
        if proc is None:
            continue
        out[pid] = proc
        if proc.ppid > 0 and proc.ppid not in out:
            todo.append(proc.ppid)
    return out


def pid_namespace(pid: int | str, proc_root: Path = Path("/proc")) -> int | None:
    """The inode of ``pid``'s PID namespace (``/proc/PID/ns/pid``), None when it cannot be read."""
    try:
        ns = os.readlink(proc_root / str(pid) / "ns" / "pid")
        return int(ns[ns.index("[") + 1:ns.index("]")])
    except (OSError, ValueError):
        return None


def _root_namespace(proc_root: Path) -> int | None:
    """The PID namespace of ``proc_root``'s own processes, when sparkd is one of them.

    Reading another process's ``ns/pid`` link needs ptrace access: a sparkd whose capabilities are fewer than the
    process's (a unit's CapabilityBoundingSet) and that lacks CAP_SYS_PTRACE (a container's default set) cannot.
    Its ``status`` is readable by all, though, and ``NSpid`` lists one PID per namespace from the one ``proc_root``
    was mounted in down to its own: a single one means it runs in that namespace, as does sparkd when its own
    ``NSpid`` has a single one too."""
    try:
        own = _status((proc_root / "self" / "status").read_text(errors="replace")).get("NSpid", "").split()
    except OSError:
        return None
    return pid_namespace("self", proc_root) if len(own) == 1 else None


def own_pid_namespace() -> int | None:
    """The inode of the PID namespace sparkd runs in."""
    return pid_namespace("self")
