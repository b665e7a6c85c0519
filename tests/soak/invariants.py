"""What must hold throughout the soak, checked by a sampler thread and after every recovery.

Each broken invariant is a :class:`Violation` with a sentence; the same sentence is counted, not repeated.
- at most one vLLM per node at any moment (main processes of the node's launch: the stand-in's ``serve``
  process whose environment carries the node's title prefix), so never two launches racing;
- ``status.json`` always parses;
- no decoy process or /dev/shm segment touched (see :mod:`decoys`);
- once a fault is recovered: no process titled with the node's prefix outside the watched instance's tree;
- the daemons' RSS and descriptor count flat from the first recovery to the end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

RSS_GROWTH = (1.5, 40 << 20)  # at the end: at most 1.5× the first sample plus 40 MiB
FD_GROWTH = 64


@dataclass
class Violation:
    what: str
    first_at: float
    during: str
    count: int = 1
    details: list[str] = field(default_factory=list)  # the first few occurrences' particulars


@dataclass
class Ledger:
    """Violations, counted by their sentence."""

    started: float = field(default_factory=time.monotonic)
    items: dict[str, Violation] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    during: str = "setup"

    def add(self, what: str, detail: str | None = None) -> None:
        with self.lock:
            if what in self.items:
                self.items[what].count += 1
            else:
                self.items[what] = Violation(what, round(time.monotonic() - self.started, 1), self.during)
            if detail and len(self.items[what].details) < 5:
                self.items[what].details.append(detail)

    def to_json(self) -> list[dict[str, Any]]:
        return [v.__dict__ for v in self.items.values()]


def vllm_mains(prefix: str) -> list[int]:
    """The stand-in's main ``serve`` processes launched with title prefix ``prefix`` (without its ``::``)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) < 3 or not cmdline[1].endswith("sparkd-standin") or "serve" not in cmdline[2:3]:
            continue
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if f"VLLM_PROCESS_NAME_PREFIX={prefix}".encode() in environ.split(b"\0"):
            out.append(proc.pid)
    return sorted(out)


def describe(pids: Iterable[int]) -> str:
    """PID, state, parent and age of each process, for a violation's details."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(f"{pid} {proc.status()} ppid {proc.ppid()} age {time.time() - proc.create_time():.1f} s")
        except psutil.Error:
            out.append(f"{pid} gone")
    return "; ".join(out)


def titled(prefix: str) -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(prefix)}


def tree_pids(pid: int | None) -> set[int]:
    if not pid:
        return set()
    try:
        root = psutil.Process(pid)
        return {root.pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def read_status(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(status, problem): a missing file is no problem; one that does not parse is."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read: {exc}"
    try:
        data = json.loads(raw)
    except ValueError:
        return None, f"does not parse: {raw[:60]!r}"
    return (data, None) if isinstance(data, dict) else (None, f"is not an object: {raw[:60]!r}")


@dataclass
class Node:
    name: str
    prefix: str  # VLLM_PROCESS_NAME_PREFIX, without "::"
    status_path: Path
    daemon_pid: Callable[[], int | None]


class Sampler(threading.Thread):
    """Every ``period`` seconds: one vLLM per node, status files parse, decoys untouched, daemon footprint."""

    def __init__(self, nodes: list[Node], ledger: Ledger, touched: Callable[[], Iterable[str]],
                 period: float = 0.5) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.nodes = nodes
        self.ledger = ledger
        self.touched = touched
        self.period = period
        self.halt = threading.Event()
        # node → (time, daemon pid, RSS, descriptors)
        self.footprint: dict[str, list[tuple[float, int, int, int]]] = {n.name: [] for n in nodes}
        self.samples = 0

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.check_once()

    def check_once(self) -> None:
        self.samples += 1
        for node in self.nodes:
            _, problem = read_status(node.status_path)
            if problem:
                self.ledger.add(f"{node.name}: status.json {problem}")
            mains = vllm_mains(node.prefix)
            if len(mains) > 1:
                self.ledger.add(f"{node.name}: {len(mains)} vLLM instances at once", describe(mains))
            self._footprint(node)
        for sentence in self.touched():
            self.ledger.add(sentence)

    def _footprint(self, node: Node) -> None:
        pid = node.daemon_pid()
        if not pid:
            return
        try:
            proc = psutil.Process(pid)
            self.footprint[node.name].append((time.monotonic(), pid, proc.memory_info().rss, proc.num_fds()))
        except psutil.Error:
            return


def orphans(node: Node, status: dict[str, Any]) -> list[str]:
    """After a recovery: processes of the node's launch outside the watched instance's tree."""
    ours = tree_pids(status.get("pid"))
    stray = sorted(titled(node.prefix + "::") - ours)
    mains = [pid for pid in vllm_mains(node.prefix) if pid not in ours]
    out = []
    if stray:
        out.append(f"{node.name}: orphan vLLM processes after recovery (titled {node.prefix}::*)")
    if mains:
        out.append(f"{node.name}: a second vLLM main process outside the watched instance after recovery")
    return out


def footprint_growth(series: list[tuple[float, int, int, int]], warmup_s: float = 15.0) -> list[str]:
    """The last daemon process's footprint: its first sample past ``warmup_s`` against its last one."""
    if not series:
        return []
    pid = series[-1][1]
    mine = [s for s in series if s[1] == pid]
    steady = [s for s in mine if s[0] >= mine[0][0] + warmup_s]
    if len(steady) < 2:
        return []
    (_, _, rss0, fds0), (_, _, rss1, fds1) = steady[0], steady[-1]
    out = []
    if rss1 > rss0 * RSS_GROWTH[0] + RSS_GROWTH[1]:
        out.append(f"RSS grew from {rss0 >> 20} MiB to {rss1 >> 20} MiB")
    if fds1 > fds0 + FD_GROWTH:
        out.append(f"open descriptors grew from {fds0} to {fds1}")
    return out
