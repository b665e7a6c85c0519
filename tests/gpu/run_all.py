#!/usr/bin/env python3
"""The GPU-host runs behind tests/gpu/README.md: sparkd beside real CUDA processes and a real NCCL pair.

    python3 tests/gpu/run_all.py --out DIR [--only info,preflight,survivor,daemon] [--main-src PATH]

Needs a host with an NVIDIA GPU, the driver, torch with NCCL, and sparkd importable (its source on PYTHONPATH with
its dependencies). Every phase runs on one GPU but the survivor, which needs two ranks on two GPUs (NCCL refuses two
ranks on one GPU): on a one-GPU host it is skipped with that reason, noted in summary.json. Every phase writes what
it saw under DIR (JSON, logs, nvidia-smi text) and appends its figures to DIR/summary.json; the power and memory of
every GPU are sampled every 0.25 s all along (DIR/power.csv). On a host without a GPU it prints why and exits 0
having run nothing. Phases:

- info: driver, CUDA, torch, NCCL; ``nvidia-smi`` CSV and ``-q``; sparkd's NVML reading.
- preflight: ``sparkd preflight --json`` (dry runs, then a real one) for a launch on the last GPU (GPU 1 of two, GPU
  0 of one) with 0.9 utilization: idle; with two GPUs, a foreign process holding 16 GiB on GPU 0 (not the launch's);
  the same on the launch's GPU; an orphaned ``VLLM::Worker_TP0`` holding 20 GiB there (dry, then a real run that
  ends it); and a launch whose
  gpu_memory_utilization x host MemTotal (+ margin) is more than the host has, where the old rule (``--main-src``,
  sparkd's main before per-device checks) refuses and the per-device rule passes.
- survivor: two ranks, a 30 s process-group timeout, rank 0 (the TCPStore host) SIGKILLed: rank 1's log (the
  TCPStore lines, the watchdog), its CPU, power and utilization; then sparkd's stop (``terminate_tree``) with a
  5 s grace, and the GPU memory's release.
- daemon: ``sparkd run`` supervising ``fake_vllm.py`` (an API server over real ranks: two on two GPUs, one on one).
  Run A: the last rank faulted — SIGKILLed with a peer to wait for it, SIGSTOPped when alone —, sparkd's canary
  declares the hang, the stop uses ``hung_stop_grace_s`` (5 s), the GPU memory is verified free, the group is started
  again; ``/metrics`` and the incident kept. Meanwhile the ranks' step-probe files (the launch renders the probe) are
  read and judged with sparkd's rules every 0.25 s, as the daemon will: when and how the stuck rank is named, and the
  files at that moment (``probe-fixture/``, for tests/data/gpu/). Run B: the same fault, then ``sparkctl stop`` at
  once: the drain grace (``stop_grace_s`` 20 s) before the SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PHASES = ("info", "preflight", "survivor", "daemon")
GPUS_NEEDED = {"info": 1, "preflight": 1, "survivor": 2, "daemon": 1}
WHY_TWO = "two NCCL ranks need two GPUs: NCCL refuses two ranks on one GPU, so a peer kill has no peer here"
GIB = 1 << 30


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


class Run:
    def __init__(self, out: Path, main_src: Path | None) -> None:
        self.out = out
        self.main_src = main_src
        self.summary: dict[str, Any] = {}
        self.events: list[tuple[float, str]] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.holders: list[int] = []  # PIDs of holders (an orphaned one is no child of ours)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._stop_sampling = threading.Event()

    # ---- bookkeeping
    def note(self, key: str, value: Any) -> None:
        self.summary[key] = value
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2, default=str) + "\n")
        log(f"{key}: {json.dumps(value, default=str)[:400]}")

    def event(self, what: str) -> None:
        self.events.append((time.time(), what))
        log(f"-- {what}")

    def used_gib(self, i: int) -> float:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handles[i]).used / GIB

    def compute_pids(self, i: int) -> list[int]:
        return [p.pid for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handles[i])]

    def sample_forever(self) -> None:
        with open(self.out / "power.csv", "w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(["t", *[f"{k}{i}" for i in range(len(self.handles))
                               for k in ("power_w", "util_pct", "used_gib", "sm_mhz")]])
            while not self._stop_sampling.is_set():
                row: list[Any] = [f"{time.time():.3f}"]
                for h in self.handles:
                    n = self.nvml
                    row += [n.nvmlDeviceGetPowerUsage(h) / 1000, n.nvmlDeviceGetUtilizationRates(h).gpu,
                            round(n.nvmlDeviceGetMemoryInfo(h).used / GIB, 2),
                            n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)]
                w.writerow(row)
                handle.flush()
                time.sleep(0.25)

    def power_between(self, t0: float, t1: float, gpu: int) -> dict[str, float]:
        with open(self.out / "power.csv") as handle:
            rows = [r for r in csv.DictReader(handle) if t0 <= float(r["t"]) < t1]
        if not rows:
            return {}
        watts = sorted(float(r[f"power_w{gpu}"]) for r in rows)
        utils = [float(r[f"util_pct{gpu}"]) for r in rows]
        return {"samples": len(rows), "median_w": watts[len(watts) // 2], "min_w": watts[0], "max_w": watts[-1],
                "mean_util_pct": round(sum(utils) / len(utils), 1)}

    def spawn(self, argv: list[str], logfile: Path | None = None, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        out = open(logfile, "ab") if logfile else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **SAFE_ENV,
                                                                                 **(env or {})})
        self.procs.append(proc)
        return proc

    def holder(self, title: str, gib: float, device: int, *, orphan: bool = False) -> int:
        ready = self.out / f"holder-{time.time_ns()}.pid"
        argv = [sys.executable, str(HERE / "holder.py"), title, str(gib), str(ready), "--device", str(device)]
        self.spawn([*argv, *(["--orphan"] if orphan else [])], self.out / "holders.log")
        deadline = time.time() + 120
        while not ready.exists():
            if time.time() > deadline:
                raise RuntimeError(f"holder {title} never got its memory")
            time.sleep(0.2)
        self.holders.append(int(ready.read_text()))
        return self.holders[-1]

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for pid in self.holders:  # an orphan left by a failed phase must not spoil the next run's preflight
            kill_pid(pid)
        self._stop_sampling.set()


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_gone(pid: int, timeout: float = 30.0) -> float:
    t0 = time.time()
    import psutil

    while time.time() - t0 < timeout:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    return time.time() - t0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default=",".join(PHASES))
    p.add_argument("--main-src", type=Path, default=None, help="sparkd's source before per-device checks")
    args = p.parse_args(argv)
    phases = [x for x in args.only.split(",") if x]
    bad = [x for x in phases if x not in PHASES]
    if bad:
        p.error(f"unknown phase(s) {bad}; choose from {', '.join(PHASES)}")
    why = no_gpu_reason()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    os.environ.update(SAFE_ENV)
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.main_src)
    threading.Thread(target=run.sample_forever, daemon=True).start()
    from phases import PHASE_FUNCTIONS

    try:
        run.note("gpus", len(run.handles))
        for phase in phases:
            if len(run.handles) < GPUS_NEEDED[phase]:
                run.note(f"{phase}.skipped", f"{len(run.handles)} GPU here: {WHY_TWO}")
                continue
            run.event(f"phase {phase}")
            try:
                PHASE_FUNCTIONS[phase](run)
            except Exception as exc:  # one phase's failure must not cost the others' figures
                import traceback

                traceback.print_exc()
                run.note(f"{phase}.error", repr(exc))
    finally:
        run.cleanup()
        (args.out / "events.json").write_text(json.dumps(run.events, indent=1) + "\n")
    return 0


def no_gpu_reason() -> str | None:
    """Why this host cannot run these (None: it can): sparkd's own NVML reader, a GPU, and torch."""
    sys.path.insert(0, str(HERE.parents[1]))
    sys.path.insert(0, str(HERE.parent))  # tests/: the step-probe fixtures' helper
    from sparkd.host.gpu.nvml import NvmlReader

    view = NvmlReader().read()
    if not view.available:
        return view.skipped
    if not view.devices:
        return "no GPU here"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    return None


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(sys.argv[1:]))
