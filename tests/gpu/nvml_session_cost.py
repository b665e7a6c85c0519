"""For a GPU host: what reading the GPUs costs a daemon, kept in-process, started and shut down per reading, or
read in a child process (issue 35: a GPU host's daemon holds ~20 MiB more than a CPU host's, the price of
``nvmlInit`` mapping libcuda, ``tests/bench/nvml_libcuda.py``).

    python tests/gpu/nvml_session_cost.py [--cycles 10] [--json out.json]

Four ways, each measured here (RSS and anonymous memory of this process after each step, whether libcuda is still
mapped, CPU seconds per reading by ``thread_time`` or the child's rusage, wall seconds):

1. ``kept``: ``nvmlInit`` once, then readings (what sparkd does now);
2. ``cycled``: ``nvmlInit``, a reading, ``nvmlShutdown`` and glibc's ``malloc_trim`` per reading: does the memory
   come back, and at what CPU a reading;
3. ``child``: a fresh interpreter that imports the reader, reads once and prints the reading as JSON;
4. ``nvidia-smi``: one ``--query-gpu`` call a reading, and a resident ``nvidia-smi -lms`` loop (its own RSS).

Takes about a minute; prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from nvml_libcuda import process

from sparkd.host.gpu import nvml
from sparkd.host.gpu.smi import GPU_FIELDS

CHILD = ("import json, sys; from sparkd.host.gpu import nvml; "
         "sys.stdout.write(json.dumps(nvml.NvmlReader().read().to_json()))")


def trim() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def snapshot(step: str, cpu_s: float | None = None, wall_s: float | None = None) -> dict[str, Any]:
    p = process()
    return {"step": step, "rss_mib": mib(p["rss_kib"]), "anon_mib": mib(p["anon_kib"]),
            "libcuda_mapped": p["libcuda_kib"] is not None, "nvml_mapped": p["nvml_kib"] is not None,
            "threads": sum(p["threads"].values()), "cpu_s": cpu_s, "wall_s": wall_s}


def timed(fn: Any) -> tuple[Any, float, float]:
    c0, w0 = time.thread_time(), time.monotonic()
    out = fn()
    return out, time.thread_time() - c0, time.monotonic() - w0


def in_process(cycles: int) -> list[dict[str, Any]]:
    import pynvml

    steps = [snapshot("pynvml imported")]
    _, c, w = timed(pynvml.nvmlInit)
    steps.append(snapshot("kept: nvmlInit", c, w))
    reader = nvml.NvmlReader()
    for i in range(3):
        _, c, w = timed(reader.read)
        steps.append(snapshot(f"kept: reading {i + 1}", c, w))
    _, c, w = timed(pynvml.nvmlShutdown)
    steps.append(snapshot("nvmlShutdown (every start balanced)", c, w))
    while True:  # sparkd's reader may have started NVML itself: shut down until NVML says it is not started
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            break
    trim()
    steps.append(snapshot("malloc_trim"))
    for i in range(cycles):
        def cycle() -> None:
            pynvml.nvmlInit()
            nvml.NvmlReader().read()
            pynvml.nvmlShutdown()
            trim()
        _, c, w = timed(cycle)
        steps.append(snapshot(f"cycled: init, reading, shutdown, trim {i + 1}", c, w))
    return steps


def child_cost(argv: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - w0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode


def children(cycles: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(min(cycles, 5)):
        cpu, wall, rc = child_cost([sys.executable, "-c", CHILD])
        rows.append({"step": f"child interpreter reading {i + 1} (rc {rc})", "cpu_s": round(cpu, 4),
                     "wall_s": round(wall, 4)})
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
        for i in range(min(cycles, 5)):
            cpu, wall, rc = child_cost(query)
            rows.append({"step": f"nvidia-smi --query-gpu {i + 1} (rc {rc})", "cpu_s": round(cpu, 4),
                         "wall_s": round(wall, 4)})
        loop = subprocess.Popen([*query, "-lms", "1000"], stdout=subprocess.DEVNULL)
        time.sleep(3)
        ticks0 = _ticks(loop.pid)
        time.sleep(10)
        ticks1 = _ticks(loop.pid)
        rss = _rss_mib(loop.pid)
        loop.terminate()
        loop.wait(10)
        rows.append({"step": "nvidia-smi -lms 1000 resident (10 s)", "rss_mib": rss,
                     "cpu_pct": round((ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / 10 * 100, 3)})
    return rows


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not nvml._driver_library_loads():
        print("no NVIDIA driver library here: run this on a GPU host")
        return 2
    steps = in_process(args.cycles)
    rows = children(args.cycles)
    for s in steps + rows:
        print(f"{s['step'][:58]:58} " + "  ".join(f"{k} {v}" for k, v in s.items() if k != "step"))
    if args.json:
        Path(args.json).write_text(json.dumps({"in_process": steps, "children": rows, "host_cpus": os.cpu_count(),
                                               "load": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
