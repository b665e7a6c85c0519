"""Leaked shared-memory segments in /dev/shm: ``psm_*``, ``sem.mp-*``, ``nccl-*`` no live process holds.

A segment is in use when any process has it open (``/proc/*/fd``) or mapped (``/proc/*/maps``). Only
segments nobody holds are removed; one in use is never touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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


def held_names(shm_dir: Path, proc: Path = Path("/proc")) -> set[str]:
    """Names under ``shm_dir`` that some process has open or mapped."""
    prefix = str(shm_dir).rstrip("/") + "/"
    held: set[str] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in os.scandir(pid_dir / "fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.add(target[len(prefix):].removesuffix(" (deleted)"))
            with open(pid_dir / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:
                        held.add(line[at + len(prefix):].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            continue
    return held


def sweep(shm_dir: Path = Path("/dev/shm"), *, dry_run: bool = False) -> list[Segment]:
    """Remove leaked segments; returns what was (or, dry-run, would be) removed."""
    found = candidates(shm_dir)
    if not found:
        return []
    held = held_names(shm_dir)
    removed = []
    for segment in found:
        if segment.name in held:
            continue
        if not dry_run:
            try:
                (shm_dir / segment.name).unlink()
            except FileNotFoundError:
                continue
            except OSError:
                continue
        removed.append(segment)
    return removed
