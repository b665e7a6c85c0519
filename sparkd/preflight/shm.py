"""Check: no leaked shared-memory segment in /dev/shm, and room for vLLM's rings.

Leaked means ``psm_*``, ``sem.mp-*`` or ``nccl-*`` that no live process has open (``<proc>/*/fd``) or mapped
(``<proc>/*/maps``). Only segments nobody holds are removed; one in use is never touched. After the sweep,
/dev/shm must have ``[preflight] shm_min_free_mib`` free (vLLM's broadcast ring alone is 160 MiB; NCCL fails
with "failed to extend /dev/shm/nccl-*" when it runs out).

The host's /dev/shm is vLLM's when it runs as a host process or in a container with ``--ipc=host``. A container
with its own IPC namespace has its own /dev/shm, which this check leaves alone (a segment's holders there are
named by paths this host cannot match safely).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from sparkd.config import RuntimeKind
from sparkd.preflight.base import MIB, CheckResult, PreflightContext, Verdict, check, human_bytes
from sparkd.supervisor.failures import FailureClass

PATTERNS = ("psm_", "sem.mp-", "nccl-")


@dataclass(frozen=True)
class Segment:
    name: str
    size: int


def candidates(shm_dir: Path) -> list[Segment]:
    out = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith(PATTERNS) and entry.is_file(follow_symlinks=False):
            try:
                out.append(Segment(entry.name, entry.stat(follow_symlinks=False).st_blocks * 512))
            except OSError:
                continue
    return out


class IncompleteView(Exception):
    """Some process's open files or mappings cannot be read (not root): no segment is provably unused."""


def scan_held(shm_dir: Path, proc: Path = Path("/proc")) -> tuple[set[str], int]:
    """(names under ``shm_dir`` that some process has open or mapped, processes that could not be read)."""
    prefix = str(shm_dir).rstrip("/") + "/"
    held: set[str] = set()
    unreadable = 0
    try:
        pid_dirs = [d for d in proc.iterdir() if d.name.isdigit()]
    except OSError:
        return held, 1
    for pid_dir in pid_dirs:
        try:
            with os.scandir(pid_dir / "fd") as fds:
                for fd in fds:
                    try:
                        target = os.readlink(fd.path)
                    except FileNotFoundError:
                        continue  # closed meanwhile
                    if target.startswith(prefix):
                        held.add(target[len(prefix):].removesuffix(" (deleted)"))
            with open(pid_dir / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:
                        held.add(line[at + len(prefix):].rstrip("\n").removesuffix(" (deleted)"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process ended meanwhile: it holds nothing
        except OSError:
            unreadable += 1
    return held, unreadable


def held_names(shm_dir: Path, proc: Path = Path("/proc")) -> set[str]:
    """Names under ``shm_dir`` that some process has open or mapped."""
    return scan_held(shm_dir, proc)[0]


def sweep(shm_dir: Path = Path("/dev/shm"), *, dry_run: bool = False, proc: Path = Path("/proc"),
          complete_view: bool | None = None) -> list[Segment]:
    """Remove leaked segments; returns what was (or, dry-run, would be) removed.

    ``complete_view`` (default: when not root) raises IncompleteView, removing nothing, if some process cannot
    be inspected. Root sees every process on a normal host; what root cannot read (a sandbox's own init, say)
    is taken not to hold our segments."""
    found = candidates(shm_dir)
    if not found:
        return []
    held, unreadable = scan_held(shm_dir, proc)
    if complete_view is None:
        complete_view = os.geteuid() != 0
    if unreadable and complete_view:
        raise IncompleteView(f"{len(found)} segment(s) in {shm_dir} may be leaked, but the open files of "
                             f"{unreadable} process(es) cannot be read (sparkd is not root): none removed")
    removed = []
    for segment in found:
        if segment.name in held:
            continue
        if not dry_run:
            try:
                (shm_dir / segment.name).unlink()
            except OSError:
                continue
        removed.append(segment)
    return removed


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


@check("dev_shm")
async def check_shm(ctx: PreflightContext) -> CheckResult:
    cfg = ctx.cfg
    if cfg.runtime is not RuntimeKind.process and not cfg.container.host_ipc:
        return CheckResult("dev_shm", Verdict.ok, f"container {cfg.container.name} has its own /dev/shm "
                           "(no --ipc=host): the host's is not vLLM's")
    try:
        removed = await anyio.to_thread.run_sync(
            lambda: sweep(ctx.shm_dir, dry_run=ctx.dry_run, proc=ctx.proc_root))
    except IncompleteView as exc:
        return CheckResult("dev_shm", Verdict.warn, str(exc))
    v, found, did = verdict(removed, free_bytes(ctx.shm_dir), cfg.preflight.shm_min_free_mib * MIB,
                            dry_run=ctx.dry_run, where=ctx.shm_dir)
    return CheckResult("dev_shm", v, found, did, failure_class=FailureClass.unknown if v is Verdict.fail else None)
