"""For a GPU host: what each NVML call sparkd's reading makes costs, in CPU time, so that the sampler's 5 s reading can
leave out what does not change.

    python3 tests/gpu/nvml_call_cost.py [--rounds 200] [--json out.json]

NVML started once; each call of a reading (``sparkd.host.gpu.nvml._device``'s, on device 0) made ``--rounds`` times
in a row, its process CPU time (``time.process_time``) and wall time per call; then a whole reading
(``NvmlReader().read()``) the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import pynvml as n

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "nvmlDeviceGetCount": lambda: n.nvmlDeviceGetCount(),
        "nvmlDeviceGetHandleByIndex": lambda: n.nvmlDeviceGetHandleByIndex(0),
        "nvmlDeviceGetUUID": lambda: n.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetName": lambda: n.nvmlDeviceGetName(h),
        "nvmlDeviceGetUtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetPowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetRemappedRows": lambda: n.nvmlDeviceGetRemappedRows(h),
        "nvmlDeviceGetTemperature": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetClockInfo(SM)": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(MEM)": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
        "nvmlDeviceGetTotalEccErrors(uncorrected)": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        "nvmlDeviceGetTotalEccErrors(corrected)": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
        "nvmlDeviceGetMemoryInfo": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetComputeRunningProcesses": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlSystemGetDriverVersion": lambda: n.nvmlSystemGetDriverVersion(),
    }
    try:
        from sparkd.host.gpu.nvml import NvmlReader

        reader = NvmlReader()
        calls["sparkd: NvmlReader().read()"] = reader.read
    except ImportError as exc:
        print(f"sparkd not importable: {exc}", file=sys.stderr)
    out = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as exc:  # a call this GPU does not support is reported, not fatal
            out[name] = {"error": repr(exc)}
            continue
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.rounds):
            call()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        out[name] = {"cpu_us": round(cpu / args.rounds * 1e6, 1), "wall_us": round(wall / args.rounds * 1e6, 1)}
    for name, row in out.items():
        print(f"{name:45s} {row}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "calls": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
