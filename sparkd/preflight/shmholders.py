"""Who holds a /dev/shm segment, by file identity (device and inode), never by the name a process shows.

A name is not an identity here. glibc's ``sem_open(O_CREAT)`` creates the semaphore under a temporary name
(``/dev/shm/sem.XXXXXX``), maps it, ``link()``s it to the real name and unlinks the temporary one, so its
creator's ``/proc/PID/maps`` shows ``/dev/shm/sem.2a5CEp (deleted)``, never ``sem.mp-…``: the line's inode is
the real file's. A process in another mount namespace shows its own paths. So a segment is held when some
process has a descriptor to its inode (``/proc/PID/fd``, stat'ed through the link) or maps its inode
(``/proc/PID/maps``: ``address perms offset major:minor inode path``) on the tmpfs's device.

The ledger remembers the segments sparkd's own launch (or a stale process, :mod:`sparkd.preflight.neighbours`)
held, by name and inode, so that once their holders are dead the sweep may remove them whatever their naming (a
``sem.mp-*`` only so). It notes only what such a process could use (an ``O_PATH`` descriptor, which anyone may
open on a file they cannot read, does not count) and only files of the holder's own uid (security.md §7).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkd.state.files import StateFile
from sparkd.state.schema import SHM_LEDGER

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

LEDGER_NAME = "shm-ledger.json"
LEDGER_MAX = 4096
O_PATH = 0o10000000  # segments remembered; the oldest notes go first
_NOT_FILES = ("socket:", "pipe:", "anon_inode:", "[")


@dataclass(frozen=True)
class Holders:
    inodes: set[int] = field(default_factory=set)  # inodes on the tmpfs some process holds
    unreadable: int = 0  # processes whose descriptors or mappings could not be read
    pids_by_inode: dict[int, set[int]] = field(default_factory=dict)


def device_of(shm_dir: Path) -> int | None:
    try:
        return os.stat(shm_dir).st_dev
    except OSError:
        return None


def maps_device(dev: int) -> str:
    """How /proc/PID/maps prints the device: ``%02x:%02x`` of major and minor."""
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def scan(dev: int, proc: Path = Path("/proc"), pids: Iterable[int] | None = None, *, usable: bool = False
         ) -> Holders:
    """The inodes on device ``dev`` that the processes under ``proc`` (or only ``pids``) hold. ``usable``: only
    descriptors that can read or write the file (an ``O_PATH`` one, which anyone may open on a file they cannot
    read, is no sign the process used it)."""
    held: dict[int, set[int]] = {}
    unreadable = 0
    if pids is None:
        try:
            pid_names = [d.name for d in os.scandir(proc) if d.name.isdigit()]
        except OSError:
            return Holders(unreadable=1)
    else:
        pid_names = [str(p) for p in pids]
    device = maps_device(dev)
    for name in pid_names:
        try:
            inodes = _fd_inodes(proc / name / "fd", dev, usable) | _mapped_inodes(proc / name / "maps", device)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile: it holds nothing
        except OSError:
            unreadable += 1
            continue
        for inode in inodes:
            held.setdefault(inode, set()).add(int(name))
    return Holders(set(held), unreadable, held)


def _fd_inodes(fd_dir: Path, dev: int, usable: bool = False) -> set[int]:
    out = set()
    with os.scandir(fd_dir) as fds:
        for fd in fds:
            try:
                if os.readlink(fd.path).startswith(_NOT_FILES):
                    continue
                if usable and opened_as_path(fd_dir.parent / "fdinfo" / fd.name):
                    continue
                st = os.stat(fd.path)  # follows the magic link: the open file itself, even if deleted
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed meanwhile
            except PermissionError:
                raise
            except OSError:
                continue
            if st.st_dev == dev and stat.S_ISREG(st.st_mode):
                out.add(st.st_ino)
    return out


def opened_as_path(fdinfo: Path) -> bool:
    """Was this descriptor opened with ``O_PATH`` (``flags:`` in ``/proc/PID/fdinfo/FD``, octal)? Unreadable:
    taken as such (it proves nothing)."""
    try:
        for line in fdinfo.read_text().splitlines():
            if line.startswith("flags:"):
                return bool(int(line.split()[1], 8) & O_PATH)
    except (OSError, ValueError, IndexError):
        return True
    return True


def uid_of(proc: Path, pid: int) -> int | None:
    """The real uid of ``pid`` (``Uid:`` in its status), None when it cannot be read."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _mapped_inodes(maps: Path, device: str) -> set[int]:
    with open(maps, "rb") as handle:
        data = handle.read()
    if f" {device} ".encode() not in data:  # most processes map nothing from the device: one search, no parse
        return set()
    out = set()
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) >= 5 and parts[3] == device and parts[4] != "0":
            out.add(int(parts[4]))
    return out


@dataclass(frozen=True)
class Entry:
    """A file in the shm folder: its name and identity."""

    name: str
    inode: int
    dev: int
    size: int  # bytes really allocated
    mtime: float
    uid: int | None = None  # the file's owner


def entries(shm_dir: Path, prefixes: tuple[str, ...]) -> list[Entry]:
    """Regular files directly in ``shm_dir`` whose names start with ``prefixes``."""
    out = []
    try:
        listing = list(os.scandir(shm_dir))
    except OSError:
        return []
    for item in listing:
        if not item.name.startswith(prefixes):
            continue
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(Entry(item.name, st.st_ino, st.st_dev, st.st_blocks * 512, st.st_mtime, st.st_uid))
    return out


class ShmLedger:
    """The segments sparkd's launches held, by (name, inode): proof they were ours once their holders died."""

    def __init__(self, path: Path, *, log: Logger | None = None, clock: Any = time.time) -> None:
        self.state = StateFile(path, SHM_LEDGER, parse=_parse, dump=_dump, log=log, clock=clock)
        self.clock = clock

    def owned(self) -> dict[tuple[str, int], dict[str, Any]]:
        return self.state.read() or {}

    def note(self, pids: Iterable[int], shm_dir: Path, proc: Path = Path("/proc"),
             prefixes: tuple[str, ...] = ("",)) -> list[str]:
        """Remember the segments in ``shm_dir`` that ``pids`` (processes proven to be a launch's) hold now,
        through a descriptor that can use the file or a mapping, and that belong to the uid of a process
        holding them (a process cannot make another user's file its launch's); returns their names."""
        pids = [p for p in pids if p > 1]
        dev = device_of(shm_dir)
        if dev is None or not pids:
            return []
        holders = scan(dev, proc, pids, usable=True).pids_by_inode
        uids = {pid: uid_of(proc, pid) for pid in {p for held in holders.values() for p in held}}
        found = [e for e in entries(shm_dir, prefixes)
                 if e.uid is not None and e.uid in {uids[p] for p in holders.get(e.inode, ())}]
        if not found:
            return []
        known = self.owned()
        now = self.clock()
        for e in found:
            known[(e.name, e.inode)] = {"name": e.name, "inode": e.inode, "dev": e.dev, "noted_at": now}
        self.state.write(_trim(known))
        return [e.name for e in found]

    def forget(self, gone: Iterable[tuple[str, int]]) -> None:
        known = self.owned()
        drop = [key for key in gone if key in known]
        if drop:
            for key in drop:
                del known[key]
            self.state.write(known)


def _parse(data: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(s["name"], s["inode"]): s for s in data["segments"]}


def _dump(known: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    return {"segments": sorted(known.values(), key=lambda s: (s.get("noted_at", 0), s["name"]))}


def _trim(known: dict[tuple[str, int], dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    if len(known) <= LEDGER_MAX:
        return known
    newest = sorted(known.items(), key=lambda kv: kv[1].get("noted_at", 0))[-LEDGER_MAX:]
    return dict(newest)
