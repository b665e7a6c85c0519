"""Incident folders: the evidence of every failure, written before anything is cleaned up.

``<state_dir>/incidents/<UTC time>-<class>/`` holds ``incident.json`` (class, sentence, exit, config hash),
``log-tail.txt``, ``meminfo.txt``, ``container.json`` (docker inspect, when a container is involved) and
``kernel-log.txt`` (when the kernel log is readable). Old folders are pruned by count.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkd.statefile import write_json
from sparkd.supervisor.failures import Failure


def incident_record(failure: Failure, *, at: float, config_hash: str, **facts: Any) -> dict[str, Any]:
    return {
        "class": failure.cls.value, "message": failure.sentence, "exit_code": failure.exit_code,
        "signal": failure.signal, "evidence": failure.evidence, "at": at,
        "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "config_hash": config_hash, **facts,
    }


def write_incident(
    root: Path, record: dict[str, Any], *, log_tail: Sequence[str], container: dict[str, Any] | None = None,
    keep: int = 50, meminfo: Path = Path("/proc/meminfo"), kernel_log: bool = True,
) -> Path:
    """Write one incident folder and prune the oldest beyond ``keep``. Returns the folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record["at"]))
    folder = _unique(root / f"{stamp}-{record['class']}")
    folder.mkdir(parents=True)
    write_json(folder / "incident.json", record)
    (folder / "log-tail.txt").write_text("\n".join(log_tail) + ("\n" if log_tail else ""), encoding="utf-8")
    try:
        shutil.copyfile(meminfo, folder / "meminfo.txt")
    except OSError as exc:
        (folder / "meminfo.txt").write_text(f"unreadable: {exc}\n")
    if container is not None:
        (folder / "container.json").write_text(json.dumps(container, indent=2, default=str) + "\n")
    kernel = _kernel_log_tail() if kernel_log else None
    if kernel is not None:
        (folder / "kernel-log.txt").write_text(kernel)
    prune(root, keep)
    return folder


def _unique(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _kernel_log_tail(lines: int = 200) -> str | None:
    try:
        out = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return "\n".join(out.stdout.splitlines()[-lines:]) + "\n"


def prune(root: Path, keep: int) -> None:
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    for old in folders[: max(0, len(folders) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def list_incidents(root: Path) -> list[dict[str, Any]]:
    """Incident records, newest first."""
    if not root.is_dir():
        return []
    out = []
    for folder in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True):
        try:
            record = json.loads((folder / "incident.json").read_text())
        except (OSError, ValueError):
            continue
        out.append({**record, "path": str(folder)})
    return out
