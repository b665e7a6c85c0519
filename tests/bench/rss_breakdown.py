"""Where a resting sparkd's memory goes, on the host it runs on: run on a GPU host and on a CPU-only one, and compare.

    .venv/bin/python tests/bench/rss_breakdown.py [--settle 30] [--json out.json]
        [--variants defaults,unbounded,no-nvml,unbounded-no-nvml]

For each variant it starts a real ``sparkd run`` with the shipped defaults supervising the vLLM stand-in (as
bench_footprint.py does), waits until vLLM is ready and ``--settle`` seconds more, then reads the daemon's own
process (not its children): RSS split anonymous / file / shmem (``/proc/PID/status``, ``smaps_rollup``), its
threads by name, glibc's malloc arenas (the 64 MiB-aligned anonymous heaps a thread's first ``malloc`` makes, up
to 8 per core) and their resident size, thread stacks, and the mappings that hold the most (``libnvidia-ml.so``
among them when NVML is loaded). The variants:

- ``defaults``: as shipped (``sparkd run`` bounds its malloc arenas to 2, ``sparkd.daemon.boot.startup``);
- ``unbounded``: glibc's own bound, 8 arenas per core (``MALLOC_ARENA_MAX`` set to it: sparkd leaves it), as
  sparkd ran before it bounded them;
- ``no-nvml``: the NVML bindings never loaded (the driver's library taken as absent, as on a CPU-only host);
- ``unbounded-no-nvml``: both;
- ``as-16-cores``: what a CPU-only host can show of 16 cores: Python's pools sized by ``os.cpu_count()`` see 16, glibc
  may make 128 arenas (not in the default list: run it with ``--variants``).

On the 16-core H100 host of ../shared/reviews/device-2026-12.md the daemon held 74.6 MiB where a 2-core CPU host's
held 53.6; the differences between these variants there say how much is NVML and how much is arenas per core.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from benchkit import (
    Owned,
    ShmLedger,
    free_port,
    log,
    sparkd_config,
    standin_env,
    unique_prefix,
    wait_healthy,
    write_json,
)
from peers import SparkdPeer

KIB, MIB = 1024, 1024 * 1024
HEAP_MAX = 64 * MIB  # glibc's HEAP_MAX_SIZE on 64-bit: a non-main arena's heap is reserved aligned to it
NO_NVML = ("import sparkd.host.gpu.nvml as nvml\n"
           "nvml._driver_library_loads = lambda: False  # rss_breakdown.py: as on a host without a driver\n")
CPUS16 = ("import os\n"
          "os.cpu_count = lambda: 16  # rss_breakdown.py: what Python sizes by the cores sees a 16-core host\n")
GLIBC_ARENAS = str(8 * (os.cpu_count() or 1))
VARIANTS: dict[str, tuple[dict[str, str], str]] = {  # (environment, sitecustomize)
    "defaults": ({}, ""),
    "unbounded": ({"MALLOC_ARENA_MAX": GLIBC_ARENAS}, ""),
    "no-nvml": ({}, NO_NVML),
    "unbounded-no-nvml": ({"MALLOC_ARENA_MAX": GLIBC_ARENAS}, NO_NVML),
    # a 16-core host as far as a CPU-only one can show it: Python's pools sized for 16 cores, glibc's 128 arenas
    "as-16-cores": ({"MALLOC_ARENA_MAX": "128"}, CPUS16),
}
_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)$")


def status_fields(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSwap", "Threads"):
            out[key] = int(value.split()[0])
    return out


def rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key.strip()] = int(value.split()[0])
    return out


def mappings(pid: int) -> list[dict[str, Any]]:
    """Each mapping of ``/proc/PID/smaps``: start, end, permissions, path, Rss (KiB)."""
    found: list[dict[str, Any]] = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = _MAP.match(line)
        if m:
            found.append({"start": int(m.group(1), 16), "end": int(m.group(2), 16), "perms": m.group(3),
                          "path": m.group(4) or "[anon]", "rss": 0})
        elif line.startswith("Rss:") and found:
            found[-1]["rss"] = int(line.split()[1])
    return found


def arenas(maps: list[dict[str, Any]]) -> tuple[int, int]:
    """glibc's non-main arenas: anonymous read-write heaps starting on a 64 MiB boundary, each followed by its
    reserved (``---p``) rest or filling the 64 MiB: (how many, their resident KiB)."""
    count = rss = 0
    for i, m in enumerate(maps):
        if m["path"] != "[anon]" or m["perms"][:2] != "rw" or m["start"] % HEAP_MAX:
            continue
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        reserved = nxt is not None and nxt["start"] == m["end"] and nxt["perms"] == "---p" and \
            nxt["end"] - m["start"] <= HEAP_MAX
        if reserved or m["end"] - m["start"] == HEAP_MAX:
            count += 1
            rss += m["rss"]
    return count, rss


def stacks(maps: list[dict[str, Any]]) -> tuple[int, int]:
    """Threads' stacks: an anonymous 8 MiB (or so) read-write mapping right after its one-page guard."""
    count = rss = 0
    for prev, m in itertools.pairwise(maps):
        size = m["end"] - m["start"]
        if prev["perms"] == "---p" and prev["end"] == m["start"] and prev["end"] - prev["start"] <= 64 * KIB and \
                m["path"] == "[anon]" and m["perms"][:2] == "rw" and 1 * MIB <= size <= 16 * MIB:
            count += 1
            rss += m["rss"]
    return count, rss


def by_path(maps: list[dict[str, Any]], top: int = 12) -> list[tuple[str, int]]:
    grouped: dict[str, int] = defaultdict(int)
    for m in maps:
        grouped[m["path"]] += m["rss"]
    return sorted(grouped.items(), key=lambda kv: -kv[1])[:top]


def threads(pid: int) -> dict[str, int]:
    names: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[(task / "comm").read_text().strip()] += 1
        except OSError:
            continue
    return dict(names)


def breakdown(pid: int) -> dict[str, Any]:
    maps = mappings(pid)
    arena_n, arena_rss = arenas(maps)
    stack_n, stack_rss = stacks(maps)
    return {"status_kib": status_fields(pid), "rollup_kib": rollup(pid), "threads": threads(pid),
            "arenas": {"count": arena_n, "rss_kib": arena_rss}, "stacks": {"count": stack_n, "rss_kib": stack_rss},
            "heap_kib": sum(m["rss"] for m in maps if m["path"] == "[heap]"),
            "nvml_kib": sum(m["rss"] for m in maps if "libnvidia" in m["path"] or "/dev/nvidia" in m["path"]),
            "nvml_loaded": any("libnvidia-ml" in m["path"] for m in maps), "top": by_path(maps)}


def run_variant(name: str, tmp: Path, settle_s: float, owned: Owned, ledger: ShmLedger) -> dict[str, Any]:
    env, custom = VARIANTS[name]
    here = tmp / name
    here.mkdir()
    env = dict(env)
    if custom:
        site = here / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(custom)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    port = free_port()
    peer = SparkdPeer(here, sparkd_config(here, port, standin_env(unique_prefix())))
    try:
        peer.daemon.start(env=env)
        if wait_healthy(port, 120) is None:
            raise RuntimeError(f"{name}: the stand-in never became ready")
        peer.daemon.wait_state("ready", timeout=60)
        ledger.note(owned.add_tree(peer.main_pid()))
        log(f"{name}: ready; settling {settle_s:.0f} s")
        time.sleep(settle_s)
        return {"variant": name, "env": env, **breakdown(peer.pid)}
    finally:
        peer.close()


def table(results: list[dict[str, Any]]) -> str:
    rows = [("variant", "RSS", "anon", "file", "shmem", "threads", "arenas (RSS)", "stacks (RSS)", "[heap]", "NVML")]
    for r in results:
        s = r["status_kib"]
        rows.append((r["variant"], f"{s.get('VmRSS', 0) / KIB:.1f}", f"{s.get('RssAnon', 0) / KIB:.1f}",
                     f"{s.get('RssFile', 0) / KIB:.1f}", f"{s.get('RssShmem', 0) / KIB:.1f}", str(s.get("Threads")),
                     f"{r['arenas']['count']} ({r['arenas']['rss_kib'] / KIB:.1f})",
                     f"{r['stacks']['count']} ({r['stacks']['rss_kib'] / KIB:.1f})", f"{r['heap_kib'] / KIB:.1f}",
                     f"{r['nvml_kib'] / KIB:.1f}" if r["nvml_loaded"] else "not loaded"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(MiB; arenas: glibc's non-main malloc heaps)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds at ready before reading")
    parser.add_argument("--variants", default="defaults,unbounded,no-nvml,unbounded-no-nvml")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    host = {"cpus": os.cpu_count(), "load": os.getloadavg(), "nvml_library": shutil.which("nvidia-smi") is not None}
    log(f"host: {host}")
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-rss-"))
    owned, ledger = Owned(), ShmLedger()
    results = []
    try:
        for name in args.variants.split(","):
            results.append(run_variant(name, tmp, args.settle, owned, ledger))
    finally:
        owned.kill_all()
        ledger.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"host: {os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(results))
    for r in results:
        print(f"\n{r['variant']}: threads {r['threads']}")
        print("  biggest mappings (KiB): " + ", ".join(f"{Path(p).name or p} {k}" for p, k in r["top"]))
    if args.json:
        write_json(args.json, {"host": host, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
