"""For a GPU host: does NVML started with ``NVML_INIT_FLAG_NO_ATTACH`` keep libcuda out of the process, and can a
reading still be made? Each variant in a fresh interpreter: start NVML its way, then read every device as sparkd
does (memory, power, utilisation, temperature, processes); after each step whether libcuda.so is mapped and the
process's RSS. Prints one JSON object per variant.

    python3 tests/gpu/nvml_flags.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r'''
import json, sys
from pathlib import Path
import pynvml as n

def state():
    maps = Path("/proc/self/maps").read_text()
    rss = next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS"))
    return {"libcuda": "libcuda.so" in maps, "rss_mib": round(rss / 1024, 1)}

variant = sys.argv[1]
out = {"variant": variant, "imported": state()}
flags = {"init": None, "no_attach": 2, "no_gpus": 1}[variant]
if flags is None:
    n.nvmlInit()
else:
    n.nvmlInitWithFlags(flags)
out["started"] = state()
read = {}
try:
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        read[i] = {"used": mem.used, "power_mw": n.nvmlDeviceGetPowerUsage(h),
                   "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
                   "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                   "procs": len(n.nvmlDeviceGetComputeRunningProcesses(h))}
except n.NVMLError as exc:
    read["error"] = str(exc)
out["read"] = read
out["after_reading"] = state()
print(json.dumps(out))
'''


def main() -> int:
    for variant in ("init", "no_attach", "no_gpus"):
        done = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True, text=True, timeout=120)
        print(done.stdout.strip() or json.dumps({"variant": variant, "error": done.stderr[-500:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
