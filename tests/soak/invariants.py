"""What must hold throughout the soak, checked by a sampler thread and after every recovery.

Each broken invariant is a :class:`Violation` with a sentence; the same sentence is counted, not repeated.
- at most one vLLM per node at any moment (main processes of the node's launch: the stand-in's ``serve``
  process whose environment carries the node's title prefix), and never two launches racing: a launch whose
  main process started while the previous one's was still seen alive (start times from the kernel, so an
  overlap shorter than the sampling period is still caught);
- ``status.json`` always parses;
- the restart breaker opens only on real failures: the soak's policy cannot be exhausted by its real faults
  (soakpair's docstring), so ``failed`` on either node is a violation, named by what opened it — a wait
  (peer lost, host unavailable), failures in a row, the budget — with the failures the lifecycle counted;
  and ``failed`` always carries a sentence;
- no decoy process or /dev/shm segment touched (see :mod:`decoys`);
- no neighbour PID changed: the neighbour instance and the hand-started vLLM beside the pair, titled with the
  head's prefix, keep every process, and the instance never restarts (see :mod:`neighbour`);
- once a fault is recovered: no process titled with the node's prefix outside the watched instance's tree;
- the daemons' RSS and descriptor count flat from the first recovery to the end.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sparkd.supervisor.failures import TREATMENT, Budget, FailureClass

RSS_GROWTH = (1.5, 40 << 20)  # at the end: at most 1.5× the first sample plus 40 MiB
FD_GROWTH = 64
WAITS = frozenset(cls.value for cls in FailureClass if TREATMENT[cls].budget is Budget.none)
TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # the resolution of a process's start time


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
    """The stand-in's main ``serve`` processes launched with title prefix ``prefix`` (without its ``::``).
    A child the main has just forked shows the main's command line until it takes its title: not a main."""
    return mains_of(_serve_processes(prefix))


def mains_of(found: dict[int, int]) -> list[int]:
    """Of the ``serve`` processes (PID → parent PID), those whose parent is not one of them."""
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


def _serve_processes(prefix: str) -> dict[int, int]:
    """PID → parent PID of the processes whose command line is the stand-in's ``serve`` of ``prefix``."""
    out = {}
    for pid, info in processes(["cmdline", "ppid"]):
        cmdline = info["cmdline"] or []
        if len(cmdline) < 3 or not cmdline[1].endswith("sparkd-standin") or "serve" not in cmdline[2:3]:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"VLLM_PROCESS_NAME_PREFIX={prefix}".encode() in environ.split(b"\0"):
            out[pid] = info["ppid"]
    return out


def processes(attrs: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(PID, ``attrs``) of every process alive now. Not ``process_iter(attrs)``: it leaves its answer in the
    ``info`` of Process objects it shares between threads, so the sampler's scan and the runner's overwrote
    each other's (seed 160: ``KeyError: 'ppid'`` ended the sampler)."""
    out = []
    for proc in psutil.process_iter():
        try:
            out.append((proc.pid, proc.as_dict(attrs)))
        except psutil.Error:
            continue
    return out


def describe(pids: Iterable[int]) -> str:
    """PID, state, parent and age of each process, for a violation's details."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(f"{pid} {proc.status()} ppid {proc.ppid()} age {time.time() - proc.create_time():.1f} s "
                       f"{' '.join(proc.cmdline())[:80]!r}")
        except psutil.Error:
            out.append(f"{pid} gone")
    return "; ".join(out)


def titled(prefix: str) -> set[int]:
    return {pid for pid, info in processes(["cmdline"]) if (info["cmdline"] or [""])[0].startswith(prefix)}


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

    @property
    def lifecycle_path(self) -> Path:
        return self.status_path.with_name("lifecycle.json")


class Sampler(threading.Thread):
    """Every ``period`` seconds: one vLLM per node, status files parse, decoys untouched, daemon footprint."""

    def __init__(self, nodes: list[Node], ledger: Ledger, touched: Callable[[], Iterable[str]],
                 period: float = 0.5, neighbours: Callable[[], Iterable[tuple[str, str]]] = lambda: [],
                 foreign: Callable[[], set[int]] = set) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.nodes = nodes
        self.ledger = ledger
        self.touched = touched
        self.neighbours = neighbours  # what changed about the neighbours (neighbour.py): (sentence, detail)
        self.foreign = foreign  # the neighbours' PIDs now: titled like a node's, never one of its vLLMs
        self.period = period
        self.halt = threading.Event()
        # node → (time, daemon pid, RSS, descriptors)
        self.footprint: dict[str, list[tuple[float, int, int, int]]] = {n.name: [] for n in nodes}
        self.launches = {n.name: Launches() for n in nodes}
        self.budget: dict[str, dict[str, int]] = {n.name: {"max_weight": 0, "max_consecutive": 0} for n in nodes}
        self.samples = 0

    def run(self) -> None:
        while not self.halt.wait(self.period):
            try:
                self.check_once()
            except Exception as exc:  # the soak's own bug: the invariants went unchecked meanwhile
                self.ledger.add(f"the soak's sampler failed ({type(exc).__name__}); it samples on", repr(exc))

    def check_once(self) -> None:
        self.samples += 1
        foreign = self.foreign()
        for node in self.nodes:
            status, problem = read_status(node.status_path)
            if problem:
                self.ledger.add(f"{node.name}: status.json {problem}")
            scanned = time.clock_gettime(time.CLOCK_BOOTTIME)  # each one found was alive then
            mains = [pid for pid in vllm_mains(node.prefix) if pid not in foreign]
            if len(mains) > 1:
                self.ledger.add(f"{node.name}: {len(mains)} vLLM instances at once", describe(mains))
            for sentence, detail in self.launches[node.name].observe(mains, scanned):
                self.ledger.add(f"{node.name}: {sentence}", detail)
            lifecycle, _ = read_status(node.lifecycle_path)
            self._budget(node.name, lifecycle or {})
            for sentence, detail in breaker_violations(node.name, status or {}, lifecycle or {}):
                self.ledger.add(sentence, detail)
            self._footprint(node)
        for sentence in self.touched():
            self.ledger.add(sentence)
        for sentence, detail in self.neighbours():
            self.ledger.add(sentence, detail)

    def _budget(self, name: str, lifecycle: dict[str, Any]) -> None:
        seen = self.budget[name]
        weight = sum(int(s.get("weight", 0)) for s in lifecycle.get("strikes") or [])
        seen["max_weight"] = max(seen["max_weight"], weight)
        seen["max_consecutive"] = max(seen["max_consecutive"], int(lifecycle.get("consecutive") or 0))

    def _footprint(self, node: Node) -> None:
        pid = node.daemon_pid()
        if not pid:
            return
        try:
            proc = psutil.Process(pid)
            rss, fds = proc.memory_info().rss, proc.num_fds()
        except psutil.Error:
            return
        if rss:  # 0: the daemon is exiting (its memory already released), no footprint to take
            self.footprint[node.name].append((time.monotonic(), pid, rss, fds))


def breaker_violations(name: str, status: dict[str, Any], lifecycle: dict[str, Any]) -> list[tuple[str, str]]:
    """A node shown ``failed`` (the breaker open): what opened it, as a sentence, with what was counted."""
    if status.get("state") != "failed":
        return []
    failure = status.get("last_failure") or {}
    out = []
    if not failure.get("message"):
        out.append((f"{name}: failed without a sentence", str(failure)))
    cls = failure.get("class", "no failure")
    reason = str((status.get("breaker") or {}).get("reason") or "")
    if cls in WAITS:
        why = f"on a wait ({cls})"
    elif "in a row" in reason:
        why = f"on {cls}: failures in a row"
    elif "restart budget" in reason:
        why = f"on {cls}: the budget"
    else:
        why = f"on {cls}"
    strikes = [s.get("class") for s in lifecycle.get("strikes") or []]
    detail = f"{reason}; consecutive {lifecycle.get('consecutive')}, failures counted {strikes}"
    out.append((f"{name}: the restart breaker opened {why}", detail))
    return out


@dataclass
class Launches:
    """One node's vLLM main processes as seen: (PID, start) → last seen alive, in seconds since boot."""

    seen: dict[tuple[int, float], float] = field(default_factory=dict)
    told: set[tuple[tuple[int, float], tuple[int, float]]] = field(default_factory=set)

    def observe(self, pids: Iterable[int], alive_at: float) -> list[tuple[str, str]]:
        """``pids``: the node's main processes found alive at ``alive_at`` (seconds since boot)."""
        for pid in pids:
            started = start_since_boot(pid)
            if started is not None:
                self.seen[(pid, started)] = alive_at
        out = []
        for a, b in overlaps(self.seen):
            if (a, b) not in self.told:
                self.told.add((a, b))
                out.append(("two launches raced: a vLLM started while the previous one still ran",
                            f"{a[0]} started {a[1]:.2f} s after boot, seen alive at {self.seen[a]:.2f}; "
                            f"{b[0]} started {b[1]:.2f}"))
        return out


Seen = tuple[int, float]  # (PID, start in seconds since boot)


def overlaps(seen: dict[Seen, float]) -> list[tuple[Seen, Seen]]:
    """Pairs (a, b) where b started while a was provably alive: a started first and was seen alive after b
    started. Start times count clock ticks, so only an overlap beyond two ticks counts."""
    out = []
    by_start = sorted(seen.items(), key=lambda item: item[0][1])
    for i, (a, a_last) in enumerate(by_start):
        for b, _ in by_start[i + 1:]:
            if b[1] < a_last - 2 * TICK_S:
                out.append((a, b))
    return out


def start_since_boot(pid: int) -> float | None:
    """A process's start time in seconds since boot (/proc/PID/stat, field 22), as CLOCK_BOOTTIME counts."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19]) * TICK_S


def orphans(node: Node, status: dict[str, Any], foreign: set[int] | frozenset[int] = frozenset()
            ) -> list[tuple[str, str]]:
    """After a recovery: processes of the node's launch outside the watched instance's tree (``foreign``: the
    neighbours', titled like the node's on purpose, are not the node's)."""
    ours = tree_pids(status.get("pid")) | set(foreign)
    stray = sorted(titled(node.prefix + "::") - ours)
    mains = [pid for pid in vllm_mains(node.prefix) if pid not in ours]
    out = []
    if stray:
        out.append((f"{node.name}: orphan vLLM processes after recovery (titled {node.prefix}::*)",
                    f"watched {status.get('pid')}; {describe(stray)}"))
    if mains:
        out.append((f"{node.name}: a second vLLM main process outside the watched instance after recovery",
                    f"watched {status.get('pid')}; {describe(mains)}"))
    return out


def footprint_growth(series: list[tuple[float, int, int, int]], warmup_s: float = 15.0) -> list[str]:
    """Each daemon process's footprint: its first sample past ``warmup_s`` against its last one."""
    out = []
    for pid in dict.fromkeys(s[1] for s in series):
        mine = [s for s in series if s[1] == pid]
        steady = [s for s in mine if s[0] >= mine[0][0] + warmup_s]
        if len(steady) < 2:
            continue
        (_, _, rss0, fds0), (_, _, rss1, fds1) = steady[0], steady[-1]
        if rss1 > rss0 * RSS_GROWTH[0] + RSS_GROWTH[1]:
            out.append(f"RSS grew from {rss0 >> 20} MiB to {rss1 >> 20} MiB")
        if fds1 > fds0 + FD_GROWTH:
            out.append(f"open descriptors grew from {fds0} to {fds1}")
    return out
