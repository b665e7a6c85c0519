"""What is stale and what is a neighbour: the one definition every path that ends or removes something uses.

A process is **stale** (sparkd may end it) when it is
- **our previous launch**: in the process tree of the launch this node's record names, the record's process
  proven to be that launch (its launch marker; :mod:`sparkd.runtime.proctree`), never only a PID; or
- **orphaned**: titled with the launch's prefix (``VLLM::`` unless the launch sets VLLM_PROCESS_NAME_PREFIX),
  run by the launch's uid in the launch's PID namespace, and the tree that launched it is gone: going up its
  parents past other titled processes, the first untitled one is a reaper (PID 1, a container's init program,
  ``systemd --user``, a containerd shim) and no live vLLM API server or launcher;
- and in neither case part of a launch that another live sparkd instance on this host registered, nor the
  watched instance, sparkd itself or init.

Everything else is a **neighbour**: never signalled, its files never removed. A titled process under a live
``vllm serve``, a person's shell, docker compose, a Python program using vLLM's ``LLM`` class or another sparkd
is a neighbour, whatever its title. Where the decision cannot see a parent (not in the process table), it
cannot prove the tree gone: a neighbour.

This module is pure: it judges a :class:`Proc` table (read by :mod:`sparkd.preflight.proctable`) against a
:class:`Scope`; the unit tables in tests/unit/test_neighbours.py script every case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePath

TITLE_PREFIX = "VLLM::"
SLACK_S = 0.05  # create times read twice differ by rounding; as proctree.CREATE_TIME_SLACK_S
# A container's init that is one of these has launched nothing itself: a process it adopted lost its launcher.
INIT_PROGRAMS = frozenset({"init", "systemd", "tini", "docker-init", "dumb-init", "catatonit", "s6-svscan",
                           "runsvdir", "sleep", "tail", "pause", "sh", "bash", "dash", "busybox"})
# Programs that set PR_SET_CHILD_SUBREAPER and adopt orphans on the host (besides PID 1).
SUBREAPERS = ("containerd-shim",)
MAX_DEPTH = 64  # a parent chain longer than this is a table that loops: nothing is proven


@dataclass(frozen=True)
class Proc:
    """One process as the decision sees it (host PIDs, or those of the PID namespace sparkd runs in)."""

    pid: int
    ppid: int
    argv: tuple[str, ...]
    start: float = 0.0  # create time, seconds since the epoch (as psutil's create_time)
    uid: int | None = None  # real uid; None when unreadable
    zombie: bool = False
    pid_ns: int | None = None  # inode of its PID namespace; None when unreadable
    ns_init: bool = False  # PID 1 of its own (innermost) PID namespace: a container's init
    marker: str | None = None  # the SPARKD_LAUNCH_ID in its environment (None: none, or unreadable)
    sid: int | None = None  # its session: the PID of the session's leader, also once that leader is gone


@dataclass(frozen=True)
class Launch:
    """A launch's root process (PID and create time) and who owns it, for sentences."""

    pid: int
    start: float
    owner: str = ""  # "sparkd instance /etc/sparkd/a.toml (state /var/lib/sparkd-a)"
    marker: str | None = None  # its SPARKD_LAUNCH_ID: every process of the launch inherits it
    uid: int | None = None  # it speaks only for processes of this uid (a user's registration); None: any


@dataclass(frozen=True)
class Place:
    """Where a launch's processes run: a PID namespace and the uid they run as (None: any uid there)."""

    pid_ns: int | None
    uid: int | None = None


@dataclass(frozen=True)
class Scope:
    """What this launch may end: its title prefix, the places its processes run (None: not restricted), its
    own previous launch (proven), the launches other live sparkd instances registered, PIDs never touched."""

    prefix: str = TITLE_PREFIX
    places: tuple[Place, ...] | None = None
    ours: Launch | None = None
    others: tuple[Launch, ...] = ()
    never_touch: frozenset[int] = field(default_factory=frozenset)


class Stale(StrEnum):
    previous_launch = "previous launch"
    orphaned = "orphaned"


@dataclass(frozen=True)
class Judgement:
    pid: int
    stale: Stale | None  # None: a neighbour
    why: str  # for sentences: why it is stale, or why it is a neighbour
    owner: str = ""  # the sparkd instance whose launch it is part of, when another one's

    @property
    def neighbour(self) -> bool:
        return self.stale is None


def is_titled(argv: tuple[str, ...] | list[str], prefix: str = TITLE_PREFIX) -> bool:
    return bool(argv) and argv[0].startswith(prefix)


def is_api_title(argv: tuple[str, ...] | list[str], prefix: str = TITLE_PREFIX) -> bool:
    """vLLM's API servers, titled ``<prefix>APIServer_N`` when several run: a live API server."""
    return is_titled(argv, prefix) and argv[0][len(prefix):].startswith("APIServer")


def program(argv: tuple[str, ...] | list[str]) -> str:
    return PurePath(argv[0]).name if argv else ""


def is_launcher(argv: tuple[str, ...]) -> bool:
    """A vLLM API server or launcher by its command line (``vllm serve``, ``python -m vllm.entrypoints…``,
    the stand-in): the tree below it is alive."""
    return any("vllm" in part.lower() or "standin" in part.lower() for part in argv[:4])


def is_reaper(proc: Proc) -> bool:
    """Does ``proc`` adopt orphans rather than launch them? PID 1, a container's init program, ``systemd
    --user``, a containerd shim; never one that looks like vLLM's launcher."""
    if is_launcher(proc.argv):
        return False
    name = program(proc.argv)
    if proc.pid == 1:
        return True
    if proc.ns_init:
        return name in INIT_PROGRAMS
    return (name == "systemd" and "--user" in proc.argv) or name.startswith(SUBREAPERS)


def same_start(proc: Proc, start: float) -> bool:
    return abs(proc.start - start) <= SLACK_S


def chain(pid: int, table: Mapping[int, Proc]) -> list[Proc]:
    """``pid`` and its ancestors, as far as the table shows them (stops at a missing parent or a loop)."""
    out: list[Proc] = []
    current = table.get(pid)
    while current is not None and len(out) < MAX_DEPTH and current not in out:
        out.append(current)
        if current.ppid <= 0 or current.ppid == current.pid:
            break
        current = table.get(current.ppid)
    return out


def launch_of(pid: int, table: Mapping[int, Proc], launches: tuple[Launch, ...], *, by_marker: bool = True
              ) -> Launch | None:
    """The launch among ``launches`` whose root is ``pid`` or one of its ancestors (same create time), or,
    ``by_marker``, one that ``pid`` inherited from although its root is gone: the marker in its environment, or
    its session, led by the launch's root (the process runtime starts every launch in a session of its own; the
    kernel does not reuse a PID while a session still bears it). vLLM's titles overwrite the environment that
    /proc shows, so a titled orphan's marker is often unreadable: its session still tells."""
    members = chain(pid, table)
    for launch in launches:
        if launch.uid is not None and (not members or members[0].uid != launch.uid):
            continue
        if by_marker and launch.marker and members and members[0].marker == launch.marker:
            return launch
        if by_marker and launch.pid > 1 and members and members[0].sid == launch.pid:
            return launch
        if any(launch.pid == m.pid and same_start(m, launch.start) for m in members):
            return launch
    return None


def in_place(proc: Proc, places: tuple[Place, ...]) -> bool:
    return any(proc.pid_ns is not None and proc.pid_ns == place.pid_ns and place.uid in (None, proc.uid)
               for place in places)


def judge(pid: int, table: Mapping[int, Proc], scope: Scope) -> Judgement:
    """Pure: is ``pid`` stale (and why), or a neighbour (and why)? See the module doc."""
    proc = table.get(pid)
    if pid in scope.never_touch or pid <= 1:
        return Judgement(pid, None, "the watched instance, sparkd itself or init")
    if proc is None:
        return Judgement(pid, None, "gone")
    if proc.zombie:
        return Judgement(pid, None, "a zombie (already dead; its parent reaps it)")
    other = launch_of(pid, table, scope.others)
    if other is not None:
        return Judgement(pid, None, f"part of the launch of {other.owner or 'another sparkd instance'}",
                         owner=other.owner)
    if scope.ours is not None and launch_of(pid, table, (scope.ours,), by_marker=False) is not None:
        return Judgement(pid, Stale.previous_launch, "part of this node's previous launch (its launch record)")
    if not is_titled(proc.argv, scope.prefix):
        return Judgement(pid, None, f"not a {scope.prefix}* process of a launch of this node")
    if scope.places is not None and not in_place(proc, scope.places):
        return Judgement(pid, None, _elsewhere(proc, scope.places))
    return _orphaned(proc, table, scope.prefix)


def _orphaned(proc: Proc, table: Mapping[int, Proc], prefix: str) -> Judgement:
    """Up past titled parents to the first untitled one: a reaper means the launching tree is gone."""
    current = proc
    for _ in range(MAX_DEPTH):
        parent = table.get(current.ppid)
        if parent is None:
            if current.ppid == 1:  # init, not in a view of /proc that shows only some processes
                return Judgement(proc.pid, Stale.orphaned, "orphaned (its launcher is gone; its parent is PID 1)")
            return Judgement(proc.pid, None, f"its parent PID {current.ppid} cannot be seen, so its launcher may "
                             "be alive")
        if is_api_title(parent.argv, prefix):
            return Judgement(proc.pid, None, f"its API server PID {parent.pid} ({parent.argv[0]}) is alive")
        if is_titled(parent.argv, prefix) and parent.pid != 1:
            current = parent
            continue
        if is_reaper(parent):
            return Judgement(proc.pid, Stale.orphaned, f"orphaned (its launcher is gone; its parent is PID "
                             f"{parent.pid} {_show(parent)})")
        return Judgement(proc.pid, None, f"its launcher PID {parent.pid} ({_show(parent)}) is alive")
    return Judgement(proc.pid, None, "its parent chain loops")


def _elsewhere(proc: Proc, places: tuple[Place, ...]) -> str:
    uids = sorted({str(p.uid) for p in places if p.pid_ns is not None and p.pid_ns == proc.pid_ns})
    if not uids:
        return ("in another PID namespace than the launch's (another container's), or in one sparkd cannot "
                "read")
    return f"run by uid {proc.uid if proc.uid is not None else '?'}, not the launch's uid {' or '.join(uids)}"


def _show(proc: Proc, limit: int = 80) -> str:
    text = " ".join(proc.argv) or "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stale(pids: list[int], table: Mapping[int, Proc], scope: Scope) -> list[Judgement]:
    """The judgements of ``pids`` that are stale, by PID."""
    return [j for j in (judge(pid, table, scope) for pid in sorted(set(pids))) if not j.neighbour]
