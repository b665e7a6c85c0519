"""For a GPU host: what the ~15 MiB of anonymous memory that ``nvmlInit`` adds to a process is, who loads libcuda,
and whether any switch the driver's NVML library reads from the environment keeps libcuda out.

    python3 tests/gpu/nvml_anon.py [--json out.json]

Three steps, each in fresh interpreters (pynvml on the path):

1. ``maps``: the anonymous mappings that appear during ``nvmlInit`` (address, size, resident KiB, from
   ``/proc/self/smaps``) and the threads it starts; the process's RSS before and after.
2. ``loader``: the dynamic loader's own account (``LD_DEBUG=libs``) of which object asked for ``libcuda.so``.
3. ``switches``: every printable string of ``libnvidia-ml.so`` and ``libcuda.so`` that looks like the name of an
   environment switch of theirs (``__NVML_``, ``__RM_``, ``CUDA_``, ``__CUDA``, ``NVIDIA_``…); each is set to ``1`` and
   then to ``0`` for one start of NVML, and the script records whether libcuda was mapped and the RSS after it.

What it showed on the one-GPU H100 host is in tests/data/gpu/README.md (fixture ``h100x1-nvml-anon.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, os, sys
from pathlib import Path

def anon():
    out, cur = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            cur = head[0] if len(head) < 6 else None
            if cur:
                lo, hi = (int(x, 16) for x in cur.split("-"))
                out[cur] = {"size_kib": (hi - lo) // 1024, "rss_kib": 0, "perms": head[1]}
        elif cur and line.startswith("Rss:"):
            out[cur]["rss_kib"] = int(head[1])
    return out

def status():
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            fields[key] = int(value.split()[0])
    return fields

import pynvml as n
before, st0 = anon(), status()
n.nvmlInit()
after, st1 = anon(), status()
maps = Path("/proc/self/maps").read_text()
new = {k: v for k, v in after.items() if k not in before or after[k]["rss_kib"] != before[k]["rss_kib"]}
threads = sorted((p / "comm").read_text().strip() for p in Path("/proc/self/task").iterdir())
print(json.dumps({"libcuda": "libcuda.so" in maps, "before": st0, "after": st1, "threads": threads,
                  "grown": sorted(new.items(), key=lambda kv: -kv[1]["rss_kib"])[:40]}))
'''

NAME = re.compile(rb"^_{0,2}[A-Z][A-Z0-9_]{4,60}$")
# the environment switches the two libraries read, by their prefixes (enum names such as NV_PFAULT_* are no switch)
PART = re.compile(rb"^(?:__NVML_|__RM_|__CUDA|CUDA_|__NV_|NV_CUDA|NVIDIA_)")


def child(env: dict[str, str] | None = None, debug: bool = False) -> tuple[dict | None, str]:
    run_env = {**os.environ, **(env or {})}
    if debug:
        run_env["LD_DEBUG"] = "libs"
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=run_env, timeout=120)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr
    except (ValueError, IndexError):
        return None, out.stderr[-2000:]


def libraries() -> list[Path]:
    """libnvidia-ml.so and the libcuda.so it loads, as this process maps them once NVML has started."""
    import pynvml

    pynvml.nvmlInit()
    found = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
             if "libnvidia-ml.so" in line or "libcuda.so" in line}
    return sorted(Path(p) for p in found)


def candidates(lib: Path) -> list[str]:
    data = lib.read_bytes()
    found = set()
    for chunk in re.findall(rb"[\x20-\x7e]{5,}", data):
        if NAME.match(chunk) and PART.search(chunk):
            found.add(chunk.decode())
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result: dict = {}
    maps, err = child()
    result["maps"] = maps if maps is not None else {"error": err}
    _, loader = child(debug=True)
    result["loader"] = [line.strip() for line in loader.splitlines()
                        if "libcuda" in line and ("needed by" in line or "dynamically loaded" in line
                                                  or "calling init" in line)][:20]
    libs = libraries()
    result["libraries"] = [str(lib) for lib in libs]
    names = sorted({name for lib in libs for name in candidates(lib)})
    result["candidates"] = names
    base = maps["after"]["VmRSS"] if maps else 0
    switches = {}
    for name in names[:200]:
        for value in ("1", "0"):
            got, _ = child({name: value})
            if got is not None:
                switches[f"{name}={value}"] = {"libcuda": got["libcuda"], "rss_kib": got["after"]["VmRSS"]}
    result["switches"] = switches
    result["keeps_libcuda_out"] = sorted(k for k, v in switches.items() if not v["libcuda"])
    result["saves_over_1_mib"] = sorted(k for k, v in switches.items() if base - v["rss_kib"] > 1024)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(json.dumps({"libcuda": maps and maps.get("libcuda"), "rss": maps and (maps["before"], maps["after"]),
                      "threads": maps and maps.get("threads"), "loader": result["loader"],
                      "candidates": names, "keeps_libcuda_out": result["keeps_libcuda_out"],
                      "saves_over_1_mib": result["saves_over_1_mib"],
                      "grown_top": maps and maps["grown"][:8]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
