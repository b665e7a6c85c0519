"""Check: no leaked shared-memory segment in /dev/shm, and room for vLLM's rings.

Only what is provably vLLM's and dead is removed (issue 16, ecosystem.md §8):
- a segment nothing holds: no process has a descriptor to it or maps it, counted by inode, so glibc's
  temporary-name mapping of a semaphore counts (see :mod:`sparkd.preflight.shmholders`);
- and either sparkd's ledger shows that our launch (or a stale process, :mod:`sparkd.preflight.neighbours`)
  held it — by name and inode, noted while they ran or found at the sweep — or it has vLLM's, NCCL's or torch's
  naming (``psm_*``, ``nccl-*``, ``torch_<pid>_*`` whose creator PID no longer runs) and belongs to a uid the
  launch runs as (another user's ``psm_*`` is theirs: security.md §7).
- A ``sem.mp-*`` is Python multiprocessing's naming, used by every Python program on the host: it is removed
  only with the ledger's proof, never by its name.
If some process's descriptors or mappings cannot be read (not root), nothing is removed.

After the sweep, /dev/shm must have ``[preflight] shm_min_free_mib`` free (vLLM's broadcast ring alone is
160 MiB; NCCL fails with "failed to extend /dev/shm/nccl-*" when it runs out).

The host's /dev/shm is vLLM's when it runs as a host process or in a container with ``--ipc=host``. A container
with its own IPC namespace has its own /dev/shm, which this check leaves alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from sparkd.config import Config
from sparkd.preflight import holders, processes
from sparkd.preflight.base import PreflightContext, Verdict, human_bytes
from sparkd.preflight.processes import container_uid
from sparkd.preflight.shmholders import Entry, ShmLedger, device_of, entries, scan

BY_NAMING = ("psm_", "nccl-", "torch_")  # removable when unheld: vLLM's SharedMemory rings, NCCL, torch
BY_PROOF_ONLY = ("sem.mp-",)  # removable only when the ledger shows our launch held it
PATTERNS = BY_NAMING + BY_PROOF_ONLY
_TORCH = re.compile(r"torch_(\d+)_")


@dataclass(frozen=True)
class Segment:
    name: str
    size: int
    inode: int = 0
    why: str = ""  # "ours" (the ledger's proof) or "naming"


def decide(found: list[Entry], held: set[int], owned: Mapping[tuple[str, int], object],
           live_pids: set[int], uids: frozenset[int] | None = None) -> list[Segment]:
    """Pure: the segments to remove among ``found``, given the held inodes, the ledger and the live PIDs.
    ``uids``: the uids the launch runs as; a segment of another user's is removed only with the ledger's proof
    (None: any uid, for a view sparkd cannot tell)."""
    out = []
    for entry in found:
        if entry.inode in held:
            continue
        if (entry.name, entry.inode) in owned:
            out.append(Segment(entry.name, entry.size, entry.inode, "ours"))
        elif (entry.name.startswith(BY_NAMING) and not _creator_alive(entry.name, live_pids)
              and (uids is None or entry.uid in uids)):
            out.append(Segment(entry.name, entry.size, entry.inode, "naming"))
    return out


def _creator_alive(name: str, live_pids: set[int]) -> bool:
    """torch names its segments torch_<creator pid>_<random>: one of a live creator may be in flight."""
    match = _TORCH.match(name)
    return match is not None and int(match.group(1)) in live_pids


def live_pids(proc: Path) -> set[int]:
    try:
        return {int(d.name) for d in os.scandir(proc) if d.name.isdigit()}
    except OSError:
        return set()


class IncompleteView(Exception):
    """Some process's open files or mappings cannot be read (not root): no segment is provably unused."""


def held_names(shm_dir: Path, proc: Path = Path("/proc")) -> set[str]:
    """Names in ``shm_dir`` whose file some process has open or mapped (under any name)."""
    dev = device_of(shm_dir)
    if dev is None:
        return set()
    held = scan(dev, proc).inodes
    return {e.name for e in entries(shm_dir, ("",)) if e.inode in held}


def sweep(shm_dir: Path = Path("/dev/shm"), *, dry_run: bool = False, proc: Path = Path("/proc"),
          complete_view: bool | None = None, ledger: Path | None = None,
          uids: frozenset[int] | None = None) -> list[Segment]:
    """Remove leaked segments; returns what was (or, dry-run, would be) removed.

    ``ledger``: sparkd's record of the segments its launches held (see module doc). ``complete_view``
    (default: when not root) raises IncompleteView, removing nothing, if some process cannot be inspected.
    Root sees every process on a normal host; what root cannot read (a sandbox's own init, say) is taken
    not to hold our segments."""
    found = entries(shm_dir, PATTERNS)
    dev = device_of(shm_dir)
    if not found or dev is None:
        return []
    holders = scan(dev, proc)
    if complete_view is None:
        complete_view = os.geteuid() != 0
    if holders.unreadable and complete_view:
        raise IncompleteView(f"{len(found)} segment(s) in {shm_dir} may be leaked, but the open files of "
                             f"{holders.unreadable} process(es) cannot be read (sparkd is not root): none removed")
    book = ShmLedger(ledger) if ledger is not None else None
    owned = book.owned() if book is not None else {}
    live = live_pids(proc)
    chosen = decide(found, holders.inodes, owned, live, uids)
    if dry_run:
        return chosen
    removed = []
    for segment in chosen:
        try:
            if os.stat(shm_dir / segment.name).st_ino != segment.inode:
                continue  # replaced since the scan
            (shm_dir / segment.name).unlink()
        except OSError:
            continue
        removed.append(segment)
    if book is not None:
        present = {(e.name, e.inode) for e in entries(shm_dir, ("",))}
        book.forget([key for key in owned if key not in present])
    return removed


def launch_uids(cfg: Config) -> frozenset[int]:
    """The uids whose segments may be removed by their naming: sparkd's own (a host launch, or a container's
    root without user namespaces) and the container's numeric ``[container] user``."""
    uid = container_uid(cfg)
    return frozenset({os.geteuid(), *([] if uid is None else [uid])})


def free_bytes(shm_dir: Path) -> int | None:
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def verdict(removed: list[Segment], free: int | None, floor: int, *, dry_run: bool, where: Path
            ) -> tuple[Verdict, str, str]:
    """Pure: (verdict, found, did) from the sweep's segments and the free space left."""
    size = sum(s.size for s in removed)
    freed = size if dry_run else 0  # a dry run has not freed it yet
    if free is not None and free + freed < floor:
        return (Verdict.fail, f"{where} has {human_bytes(free + freed)} free, less than the "
                f"{human_bytes(floor)} vLLM needs ([preflight] shm_min_free_mib): something else fills it",
                f"removed {len(removed)} leaked segment(s)" if removed and not dry_run else "")
    if not removed:
        return Verdict.ok, f"no leaked segment in {where}", ""
    names = ", ".join(s.name for s in removed[:10]) + (" ..." if len(removed) > 10 else "")
    text = f"{len(removed)} leaked segment(s) no live process holds: {names}"
    if dry_run:
        return Verdict.warn, text, f"would remove them, freeing {size} bytes ({human_bytes(size)})"
    return Verdict.fixed, text, f"removed them, freed {size} bytes ({human_bytes(size)})"


async def largest(ctx: PreflightContext, n: int = 3) -> str:
    """When /dev/shm is too full: its largest files and who holds them (PID, command line, container, owning
    sparkd instance), so that the operator knows whose they are; sparkd removes none of a neighbour's."""
    def scan_largest() -> tuple[list[Entry], dict[int, set[int]]]:
        dev = device_of(ctx.shm_dir)
        biggest = sorted(entries(ctx.shm_dir, ("",)), key=lambda e: -e.size)[:n]
        return biggest, (scan(dev, ctx.proc_root).pids_by_inode if dev is not None and biggest else {})

    biggest, by_inode = await anyio.to_thread.run_sync(scan_largest)
    pids = sorted({pid for e in biggest for pid in by_inode.get(e.inode, set())})
    judged = await anyio.to_thread.run_sync(processes.judge, ctx, pids) if pids else {}
    containers = {pid: holders.container_of(ctx.proc_root, pid) for pid in pids}
    names = await holders.container_names(c for c in containers.values() if c)
    parts = []
    for e in biggest:
        held = [holders.describe(pid, holders.cmdline_of(ctx.proc_root, pid), containers[pid], judged[pid].owner,
                                 names) for pid in sorted(by_inode.get(e.inode, set()))[:2]]
        parts.append(f"{e.name} ({human_bytes(e.size)}" + (f", held by {'; '.join(held)})" if held else ", unheld)"))
    return f"; the largest: {', '.join(parts)}" if parts else ""
