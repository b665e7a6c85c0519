"""Host process trees: identity, event-driven exit waits, and SIGTERM → grace → SIGKILL.

Docker has no API to kill an exec'd process, so every runtime stops vLLM through host PIDs. A PID alone is
not an identity (PIDs are reused), and neither is PID + create time when the record naming them can be
forged or stale. Rules:
- A launch is marked: its environment carries ``SPARKD_LAUNCH_ID=<random>`` (:func:`launch_marker`), which
  every process of its tree inherits through every ``exec``. :class:`ProcessIdentity` records the PID, its
  create time and that marker at launch; :func:`same_identity` proves a live process is that launch: same
  create time, and the marker in ``/proc/PID/environ``.
- Without a marker (a record from before markers) or where the environment cannot be told (unreadable, or
  overwritten by a process title: setproctitle reuses that memory), the process must
  run what the config launches (:class:`Expected`, from the config, never from the record): the configured
  executable (directly or under an interpreter), the launcher ``bash <script>``, or vLLM's process title.
- Nothing ever signals PID ≤ 1, sparkd itself or one of sparkd's ancestors (:func:`never_signal`), whatever
  the caller passes; :func:`terminate_tree` given an identity signals nothing unless it is proven.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil

MARKER_ENV = "SPARKD_LAUNCH_ID"
CREATE_TIME_SLACK_S = 0.05
INTERPRETERS = ("python", "python3", "bash", "sh", "env")


def launch_marker() -> str:
    """A fresh value for ``SPARKD_LAUNCH_ID``: put it in the launch's environment and its identity."""
    return secrets.token_hex(16)


def same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one created at ``create_time`` and not a zombie."""
    if pid <= 1:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > CREATE_TIME_SLACK_S or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return None


def create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


@dataclass(frozen=True)
class Expected:
    """What the config launches: what a process must run to be taken for ours without the marker's proof."""

    executable: str  # argv[0] of the rendered launch (or "bash" for a user's script)
    script: str | None = None  # the launch script bash runs
    title_prefix: str = "VLLM::"

    def matches(self, cmdline: list[str]) -> bool:
        if not cmdline:
            return False
        if cmdline[0].startswith(self.title_prefix):
            return True
        if self.script is not None and self.script in cmdline[1:]:
            return True  # the launcher: bash [-c ...] <launch script>
        want = Path(self.executable).name
        if is_interpreter(want):
            return False  # "python" or "bash" alone proves nothing
        names = [Path(part).name for part in cmdline[:2]]
        return names[0] == want or (is_interpreter(names[0]) and len(names) > 1 and names[1] == want)


def is_interpreter(name: str) -> bool:
    return name.rstrip("0123456789.") in INTERPRETERS


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a launched process is, recorded at launch (see the module doc)."""

    pid: int
    create_time: float
    marker: str | None = None  # the SPARKD_LAUNCH_ID its environment carries
    exe: str | None = None  # at record time: for the record's reader, not for the proof
    cmdline: list[str] = field(default_factory=list)
    title: str | None = None

    @classmethod
    def of(cls, pid: int, marker: str | None = None) -> ProcessIdentity:
        """The identity of the live process ``pid`` now (raises psutil.NoSuchProcess if it is gone)."""
        proc = psutil.Process(pid)
        with proc.oneshot():
            cmdline = [part for part in _safe(proc.cmdline, []) if part]
            return cls(pid=pid, create_time=proc.create_time(), marker=marker, exe=_safe(proc.exe, None),
                       cmdline=cmdline, title=cmdline[0] if cmdline and "::" in cmdline[0] else None)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ProcessIdentity:
        """From a record validated by ``sparkd.state.schema.IDENTITY``."""
        return cls(pid=int(data["pid"]), create_time=float(data["create_time"]), marker=data.get("marker"),
                   exe=data.get("exe"), cmdline=list(data.get("cmdline") or []), title=data.get("title"))


def _safe(getter: Any, default: Any) -> Any:
    try:
        return getter()
    except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return default


def environ_marker(proc: psutil.Process) -> str | bool | None:
    """The process's SPARKD_LAUNCH_ID; None when it has none; False when its environment cannot be told:
    unreadable, or overwritten (setproctitle reuses the environment's memory for a long title, and
    /proc/PID/environ shows that memory)."""
    try:
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes()
    except OSError:
        return False
    items = [item for item in raw.split(b"\0") if b"=" in item]
    if not items:
        return False
    prefix = MARKER_ENV.encode() + b"="
    for item in items:
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def same_identity(identity: ProcessIdentity, expected: Expected | None = None) -> psutil.Process | None:
    """The live process ``identity`` names, if this is provably it (see the module doc); else None."""
    proc = same_process(identity.pid, identity.create_time)
    if proc is None or never_signal(proc.pid):
        return None
    found = environ_marker(proc)
    if identity.marker and found is not False:
        return proc if found == identity.marker else None
    if expected is None:
        return None
    return proc if expected.matches([part for part in _safe(proc.cmdline, []) if part]) else None


def ancestors(pid: int | None = None) -> set[int]:
    """``pid`` (default: this process) and every process above it (the parent links in /proc/PID/stat: psutil
    builds a Process, with its create time, for each link; this runs on every stop)."""
    out: set[int] = set()
    current = os.getpid() if pid is None else pid
    while current > 0 and current not in out:
        parent = parent_of(current)
        if parent is None:
            break
        out.add(current)
        current = parent
    return out


def parent_of(pid: int) -> int | None:
    """The parent PID from /proc/PID/stat (the field after the state), or None when ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def roots(pids: set[int]) -> set[int]:
    """The members of a process tree whose parent is not in it: the tree's root (a process whose parent is
    gone or unreadable counts as one)."""
    return {pid for pid in pids if parent_of(pid) not in pids}


def never_signal(pid: int) -> bool:
    """PID ≤ 1, sparkd itself and sparkd's ancestors (its shell, systemd, a container's init): never."""
    return pid <= 1 or pid in ancestors()


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` first, then all its descendants (missing ones skipped), listed as :func:`tree_pids` does: every
    stop lists the tree right before its SIGTERM, and psutil's ``children()`` reads every process on the host
    (1.3 ms idle, 16 ms in a daemon whose guard is stopping a vLLM that allocates)."""
    if pid <= 0:
        return []
    members = []
    for member in [pid, *sorted(tree_pids(pid) - {pid})]:
        try:
            members.append(psutil.Process(member))
        except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError):
            if member == pid:
                return []
    return members


def _psutil_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError):
        return []


def tree_pids(pid: int) -> set[int]:
    """``pid`` and its descendants' PIDs, from the kernel's per-task ``children`` lists: it reads the tree's own
    entries in /proc, where psutil's ``children()`` reads every process's (the guard asks this at rest)."""
    if pid <= 0:
        return set()
    found: set[int] = set()
    todo = [pid]
    try:
        while todo:
            current = todo.pop()
            try:
                tasks = os.listdir(f"/proc/{current}/task")
            except (FileNotFoundError, ProcessLookupError):
                continue  # gone meanwhile (the root gone: nothing)
            found.add(current)
            for task in tasks:
                try:
                    with open(f"/proc/{current}/task/{task}/children") as handle:
                        todo.extend(int(child) for child in handle.read().split() if int(child) not in found)
                except (FileNotFoundError, ProcessLookupError):
                    continue
    except OSError:  # no children files (CONFIG_PROC_CHILDREN off): the slow way
        return {p.pid for p in _psutil_tree(pid)}
    return found


async def wait_exit(pid: int, create_time: float | None = None) -> None:
    """Return once ``pid`` has exited (it may be a zombie awaiting its parent's reap). Event-driven: pidfd.

    With ``create_time``, a process of that PID created at another time counts as exited: the pidfd is opened
    before the identity check, so a PID reused meanwhile cannot be mistaken for it."""
    if pid <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if create_time is not None and same_process(pid, create_time) is None:
            return
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


def signal_all(procs: list[psutil.Process], sig: int) -> list[int]:
    """Send ``sig`` to each of ``procs`` except those :func:`never_signal` names; returns the PIDs reached.

    psutil checks each process's create time before signalling, so a PID reused since is not hit."""
    spared = ancestors()
    reached = []
    for proc in procs:
        if proc.pid <= 1 or proc.pid in spared:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)
            reached.append(proc.pid)
    return reached


async def terminate_tree(pid: int, grace_s: float, *, identity: ProcessIdentity | None = None,
                         expected: Expected | None = None) -> list[int]:
    """SIGTERM the root, wait up to ``grace_s`` for the whole tree, SIGKILL what is left.

    Returns the PIDs that had to be killed. The root is signalled first because vLLM shuts its own
    children down in order on SIGTERM; the children get SIGKILL only if they outlive the grace.
    With ``identity``, nothing is signalled unless :func:`same_identity` proves the root is it. PID ≤ 1,
    sparkd and its ancestors are never signalled.
    """
    if never_signal(pid):
        return []
    if identity is not None and (identity.pid != pid or same_identity(identity, expected) is None):
        return []
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
