"""For a GPU host: which NVML call loads libcuda into the caller (sparkd's daemon reads its GPUs through NVML).

    .venv/bin/python tests/bench/nvml_libcuda.py [--json out.json]

In this one process, step by step: start NVML (``nvmlInit``), call every NVML function a sparkd reading calls on
every device, make a reading as the daemon does (``NvmlReader().read()``), then call
``nvmlSystemGetCudaDriverVersion``. After each step: whether ``libcuda.so`` is mapped here (and its resident KiB),
the process's RSS and anonymous memory, and its threads by name. Takes a second or two.

What it showed on the one-GPU H100 host (driver 580.159.04, tests/data/gpu/h100x1-nvml-libcuda.json): ``nvmlInit``
itself maps libcuda (3.8 MiB) and starts a thread of libcuda's; RSS 18.9 -> 37.3 MiB, anonymous 11.5 -> 26.3 MiB, at
that first step; no later call adds more than 0.3 MiB. So the ~20 MiB a GPU host's daemon holds beyond a CPU host's is
the price of reading the GPUs in-process through NVML at all, not of one query sparkd could leave out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from sparkd.host.gpu import nvml


def mapped(name: str) -> int | None:
    """Resident KiB of the mappings whose path holds ``name``; None when none is mapped."""
    found, rss, current = False, 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:
            current = len(head) >= 6 and name in head[-1]
            found = found or current
        elif current and line.startswith("Rss:"):
            rss += int(line.split()[1])
    return rss if found else None


def process() -> dict[str, Any]:
    status = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in
              Path("/proc/self/status").read_text().splitlines()) if k in ("VmRSS", "RssAnon")}
    threads = Counter((t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir())
    return {"libcuda_kib": mapped("libcuda"), "nvml_kib": mapped("libnvidia-ml"), "rss_kib": status.get("VmRSS"),
            "anon_kib": status.get("RssAnon"), "threads": dict(threads)}


READING = ("nvmlDeviceGetClockInfo", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetEnforcedPowerLimit",
           "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetName", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetRemappedRows",
           "nvmlDeviceGetTemperature", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetUUID",
           "nvmlDeviceGetUtilizationRates", "nvmlSystemGetDriverVersion")  # what a reading asks besides the start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import pynvml

    steps: list[dict[str, Any]] = [{"step": "pynvml imported", **process()}]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print(f"NVML does not start here ({exc}): run this on a GPU host")
        return 2
    steps.append({"step": "nvmlInit", **process()})
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    for name in READING:
        fn = getattr(pynvml, name)
        extra: tuple[Any, ...] = {"nvmlDeviceGetTemperature": (pynvml.NVML_TEMPERATURE_GPU,),
                                  "nvmlDeviceGetClockInfo": (pynvml.NVML_CLOCK_SM,),
                                  "nvmlDeviceGetTotalEccErrors": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                                  pynvml.NVML_VOLATILE_ECC)}.get(name, ())
        for handle in handles if name.startswith("nvmlDevice") else [None]:
            try:
                fn(handle, *extra) if handle is not None else fn()
            except pynvml.NVMLError as exc:
                steps.append({"step": f"{name}: {exc}", **process()})
        steps.append({"step": name, **process()})
    view = nvml.NvmlReader().read()
    steps.append({"step": f"sparkd's reading: {len(view.devices)} devices, driver {view.driver}, CUDA {view.cuda}",
                  **process()})
    steps.append({"step": f"nvmlSystemGetCudaDriverVersion = {pynvml.nvmlSystemGetCudaDriverVersion()}",
                  **process()})
    for s in steps:
        cuda = "not mapped" if s["libcuda_kib"] is None else f"MAPPED {s['libcuda_kib']} KiB"
        print(f"{s['step'][:80]:80}  libcuda {cuda:18}  RSS {s['rss_kib'] / 1024:6.1f} MiB  "
              f"anon {s['anon_kib'] / 1024:6.1f}  threads {s['threads']}")
    loads = next((s["step"] for s in steps if s["libcuda_kib"] is not None), None)
    print(f"\nlibcuda first mapped after: {loads or 'none of these steps'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": steps, "view": view.to_json()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
