"""Incident folders: the evidence of every failure, written before anything is cleaned up.

``<state_dir>/incidents/<UTC time>-<class>/`` holds ``incident.json`` (class, sentence, exit, config hash),
``log-tail.txt``, and what the failure table (``failures.TREATMENT[cls].evidence``) asks for: ``meminfo.txt``,
``kernel-log.txt`` (when the kernel log is readable), ``container.json`` (docker inspect, when a container is
involved) and ``guard.json`` (the memory guard's samples and trend). On a node with NVIDIA GPUs every folder also
gets ``gpu.json`` (the NVML reading and the launch's power history) and ``nvidia-smi-q.txt``; the stop that answered
the failure adds ``stop.json`` (its grace, whether sparkd had to SIGKILL, the GPU memory's release) and the record's
``stop``. Old folders are pruned by count.

Root writes and deletes here, so nothing is taken on trust (security review §3: with ``incidents`` a symlink to
another directory, the pruner removed five folders that were not its own): the root must be a real directory
(``lstat``, never a link), every file is created ``O_EXCL|O_NOFOLLOW`` in a folder made for it, and the
pruner and the listing consider only real directories whose names are the writer's own pattern
(:data:`FOLDER`).

:class:`IncidentWriter` writes in a worker thread (the kernel-log read and the disk never block the event
loop), except :meth:`IncidentWriter.write_now`, the memory guard's quick synchronous write before a signal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.host.safefile import create_new
from sparkd.state.files import read_regular, to_json, write_json
from sparkd.supervisor.failures import Evidence, Failure

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

KERNEL_LOG_LINES = 200
FOLDER = re.compile(r"^\d{8}T\d{6}Z-[a-z_]+(-\d+)?$")  # <UTC stamp>-<class>[-N]: what write_incident names


class UnsafeRoot(OSError):
    """The incidents root is not a real directory (a symlink, a file): sparkd writes and prunes nothing there."""


def incident_record(failure: Failure, *, at: float, config_hash: str, **facts: Any) -> dict[str, Any]:
    return {
        "class": failure.cls.value, "message": failure.sentence, "exit_code": failure.exit_code,
        "signal": failure.signal, "evidence": failure.evidence, "at": at,
        "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "config_hash": config_hash, **facts,
    }


class IncidentWriter:
    """Incident folders under ``root``, the oldest beyond ``keep`` (each write's, as the config says then) removed."""

    def __init__(self, root: Path, *, log: Logger, meminfo: Path = Path("/proc/meminfo")) -> None:
        self.root = root
        self.log = log
        self.meminfo = meminfo

    def write_now(self, record: dict[str, Any], log_tail: Sequence[str], *, keep: int,
                  guard: dict[str, Any] | None = None) -> Path | None:
        """Synchronous and quick (no kernel log, no Docker): for the guard, before it signals anything."""
        return self._write(record, log_tail, frozenset({Evidence.meminfo, Evidence.guard}), keep, None, guard)

    async def write(self, record: dict[str, Any], log_tail: Sequence[str], *, evidence: frozenset[Evidence],
                    keep: int, container: dict[str, Any] | None = None, guard: dict[str, Any] | None = None,
                    gpu: GpuEvidence | None = None) -> Path | None:
        return await anyio.to_thread.run_sync(self._write, record, list(log_tail), evidence, keep, container, guard,
                                              gpu)

    def _write(self, record: dict[str, Any], log_tail: Sequence[str], evidence: frozenset[Evidence], keep: int,
               container: dict[str, Any] | None, guard: dict[str, Any] | None,
               gpu: GpuEvidence | None = None) -> Path | None:
        try:
            folder = write_incident(self.root, record, log_tail=log_tail, evidence=evidence, container=container,
                                    guard=guard, meminfo=self.meminfo, keep=keep)
            if gpu is not None:
                write_gpu(folder, gpu)
        except OSError as exc:
            self.log.error("incident_write_failed", failure=record["class"], error=str(exc))
            return None
        self.log.warning("incident", failure=record["class"], reason=record["message"], folder=str(folder))
        return folder


@dataclass(frozen=True)
class GpuEvidence:
    reading: dict[str, Any]  # the NVML reading and the launch's power history (sparkd.daemon.watch.gpus)
    smi_q: str | None = None  # `nvidia-smi -q`


def write_gpu(folder: Path, gpu: GpuEvidence) -> None:
    create_new(folder / "gpu.json", (json.dumps(gpu.reading, indent=2, default=str) + "\n").encode())
    if gpu.smi_q is not None:
        create_new(folder / "nvidia-smi-q.txt", gpu.smi_q.encode("utf-8", errors="replace"))


def attach_stop(folder: Path, stop: dict[str, Any]) -> None:
    """The stop that answered the incident's failure: the record's ``stop``, then ``stop.json``."""
    try:
        record = json.loads((folder / "incident.json").read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict):
        write_json(folder / "incident.json", {**record, "stop": stop})
    write_json(folder / "stop.json", stop)


def write_incident(
    root: Path, record: dict[str, Any], *, log_tail: Sequence[str], evidence: frozenset[Evidence],
    container: dict[str, Any] | None = None, guard: dict[str, Any] | None = None,
    meminfo: Path = Path("/proc/meminfo"), keep: int = 50,
) -> Path:
    """Write one incident folder and prune the oldest beyond ``keep``. Returns the folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record["at"]))
    checked_root(root, create=True)
    folder = _unique(root / f"{stamp}-{record['class']}")
    folder.mkdir(mode=0o750)
    files = {"incident.json": to_json(record), "log-tail.txt": "\n".join(log_tail) + ("\n" if log_tail else "")}
    if Evidence.meminfo in evidence:
        try:
            files["meminfo.txt"] = meminfo.read_text(errors="replace")
        except OSError as exc:
            files["meminfo.txt"] = f"unreadable: {exc}\n"
    if Evidence.container in evidence and container is not None:
        files["container.json"] = json.dumps(container, indent=2, default=str) + "\n"
    if Evidence.guard in evidence and guard is not None:
        files["guard.json"] = json.dumps(guard, indent=2, default=str) + "\n"
    kernel = _kernel_log_tail() if Evidence.kernel_log in evidence else None
    if kernel is not None:
        files["kernel-log.txt"] = kernel
    for name, text in files.items():
        create_new(folder / name, text.encode("utf-8", errors="replace"))
    prune(root, keep)
    return folder


def checked_root(root: Path, *, create: bool = False) -> bool:
    """Whether ``root`` is a real directory (made when missing and ``create``); UnsafeRoot when something else
    (a symlink, a file) has its name."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        if not create:
            return False
        root.mkdir(parents=True, mode=0o750, exist_ok=True)
        st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeRoot(f"{root} is {kind}; sparkd keeps incidents only in a real directory of its own")
    return True


def _own_folders(root: Path) -> list[Path]:
    """The incident folders under ``root``: real directories named as the writer names them, oldest first."""
    if not checked_root(root):
        return []
    out = []
    for entry in os.scandir(root):
        if FOLDER.match(entry.name) and entry.is_dir(follow_symlinks=False):
            out.append(Path(entry.path))
    return sorted(out)


def _unique(path: Path) -> Path:
    candidate, n = path, 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _kernel_log_tail(lines: int = KERNEL_LOG_LINES) -> str | None:
    try:
        out = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return "\n".join(out.stdout.splitlines()[-lines:]) + "\n"


def prune(root: Path, keep: int) -> None:
    """Remove the oldest incident folders beyond ``keep`` — only folders of the writer's own pattern, never through
    a link (``shutil.rmtree`` walks by descriptor); under a root that is not a real directory, nothing."""
    try:
        folders = _own_folders(root)
    except OSError:
        return
    for old in folders[: max(0, len(folders) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def list_incidents(root: Path) -> list[dict[str, Any]]:
    """Incident records, newest first (a folder without a readable record is left out)."""
    try:
        folders = _own_folders(root)
    except OSError:
        return []
    out = []
    for folder in reversed(folders):
        try:
            record = json.loads(read_regular(folder / "incident.json"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            out.append({**record, "path": str(folder)})
    return out


def log_tail_of(folder: Path) -> str:
    """An incident's log tail; a folder without one says so."""
    try:
        return (folder / "log-tail.txt").read_text(errors="replace")
    except OSError as exc:
        return f"(no log tail: {exc})\n"
