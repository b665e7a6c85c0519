"""Benchmark: sparkd's memory guard against earlyoom, on real memory, in the same run.

    .venv/bin/python tests/bench/bench_guard.py [--runs 5] [--rates 0.5,2,4] [--json bench-guard.json]

A child allocates real, resident memory at 0.5, 2 and 4 GiB/s toward a floor set ``--distance-gib`` (2)
under this machine's MemAvailable at the start of each run (other work on the host moves the baseline).
The guard under test is either the in-process sparkd ``Guard`` (default config; its stop floor at the
floor: SIGTERM, its kill floor 1 GiB under) or ``earlyoom -M floor,kill`` (the same two floors, ``--prefer``
the allocator). A separate observer process reads /proc/meminfo every 0.5 ms and watches the allocator's
pidfd. Per run:

- reaction: from the observer's first sample under the floor to the moment the allocator's SIGTERM handler
  runs (to its death when it was SIGKILLed);
- overshoot: how far under the floor MemAvailable went before the allocator's memory came back; and how far
  under it was at the moment of the SIGTERM (what the guard let through: the allocator's memory comes back
  only as it exits, some 100s of ms later, and the machine's other work moves MemAvailable meanwhile);
- achieved rate: the observer's slope over the 300 ms before the crossing (a VM may not reach 4 GiB/s).

Medians over the runs and the sparkd/earlyoom ratios are printed as a markdown table; everything goes to
the JSON file (``--json``, default in the temp folder). Safety: the allocator is capped at distance +
2.5 GiB and a run is skipped unless MemAvailable would stay above 6 GiB with the cap allocated. Children
are ended by PID.

Internal modes (the children): ``bench_guard.py alloc RATE_MIB_S CAP_MIB`` and
``bench_guard.py watch FLOOR_BYTES PID``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

GIB = 1024**3
MIB = 1024**2
SAFE_AVAILABLE = 6 * GIB
CAP_BEYOND_FLOOR = int(2.5 * GIB)
KILL_BELOW_FLOOR = GIB
ALLOC_CHUNK = 8 * MIB  # small, so the SIGTERM handler runs within a few ms
HERE = Path(__file__).resolve()


# ---- child: the allocator ---------------------------------------------------------------------------


def alloc_main(rate_mib_s: float, cap_mib: int) -> None:
    """Allocate and populate memory at the rate; print the monotonic time SIGTERM arrived, then exit."""
    Path("/proc/self/comm").write_text("benchalloc")
    Path("/proc/self/oom_score_adj").write_text("1000")

    def on_term(signum: int, frame: Any) -> None:
        os.write(1, f"term {time.monotonic():.6f}\n".encode())
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    rate, cap = rate_mib_s * MIB, cap_mib * MIB
    chunks, total = [], 0
    print("ready", flush=True)
    sys.stdin.readline()  # go
    start = time.monotonic()
    while total < cap:
        target = min(cap, int(rate * (time.monotonic() - start)))
        while total < target:
            m = mmap.mmap(-1, ALLOC_CHUNK)
            try:
                m.madvise(23)  # MADV_POPULATE_WRITE (Linux 5.14)
            except OSError:
                memoryview(m)[::4096] = b"\1" * (ALLOC_CHUNK // 4096)
            chunks.append(m)
            total += ALLOC_CHUNK
        time.sleep(0.001)
    print("capped", flush=True)
    time.sleep(60)


# ---- child: the observer ----------------------------------------------------------------------------


def watch_main(floor: int, pid: int) -> None:
    """Sample MemAvailable every 0.5 ms until ``pid`` has died and 300 ms more; print the findings."""
    from sparkd.guard.meminfo import MeminfoReader

    reader, pidfd = MeminfoReader(), os.pidfd_open(pid)
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    history: list[tuple[float, int]] = []
    cross = dead = lowest = lowest_at = None
    print("ready", flush=True)
    while True:
        now, avail = time.monotonic(), reader.read().mem_available
        history.append((now, avail))
        if cross is None and avail < floor:
            cross = now
        if lowest is None or avail < lowest:
            lowest, lowest_at = avail, now
        if dead is None and poll.poll(0):
            dead = now
        if dead is not None and now - dead > 0.3:
            break
        time.sleep(0.0005)
    window = [(t, a) for t, a in history if cross is None or 0 <= cross - t <= 0.3]
    rate = (window[0][1] - window[-1][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else None
    print(json.dumps({"cross": cross, "dead": dead, "lowest": lowest, "lowest_at": lowest_at, "rate": rate,
                      "trajectory": history if cross is None else [(t, a) for t, a in history if t >= cross]}),
          flush=True)


# ---- one run ----------------------------------------------------------------------------------------


def available() -> int:
    from sparkd.guard.meminfo import MeminfoReader

    with MeminfoReader() as reader:
        return reader.read().mem_available


def settle(timeout_s: float = 15.0) -> int:
    """Wait until MemAvailable holds still (the last allocator's memory is back); return it."""
    deadline = time.monotonic() + timeout_s
    last = available()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = available()
        if abs(now - last) < 32 * MIB:
            return now
        last = now
    return last


def spawn(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def end(proc: subprocess.Popen[Any]) -> None:
    """End a child we started, by its PID."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def go(alloc: subprocess.Popen[str]) -> None:
    assert alloc.stdin is not None
    alloc.stdin.write("go\n")
    alloc.stdin.flush()


def wait_dead(alloc: subprocess.Popen[str], timeout_s: float = 30.0) -> bool:
    try:
        alloc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def one_run(guard: str, rate_gib_s: float, floor: int, cap_mib: int) -> dict[str, Any]:
    alloc = spawn("alloc", str(rate_gib_s * 1024), str(cap_mib))
    watcher = spawn("watch", str(floor), str(alloc.pid))
    try:
        extra = run_sparkd(alloc, floor) if guard == "sparkd" else run_earlyoom(alloc, floor)
        out, _ = watcher.communicate(timeout=30)
        seen = json.loads(out.strip().splitlines()[-1])
    finally:
        end(alloc)
        end(watcher)
    term = term_time(alloc)
    trajectory = seen.pop("trajectory")
    result = {"guard": guard, "rate_target": rate_gib_s, "floor": floor, **extra, **seen, "term": term}
    if seen["cross"] is not None:
        signalled = term if term is not None else seen["dead"]
        result["reaction_ms"] = None if signalled is None else (signalled - seen["cross"]) * 1000
        result["exit_ms"] = None if seen["dead"] is None else (seen["dead"] - seen["cross"]) * 1000
        result["overshoot_mib"] = max(0, floor - seen["lowest"]) / MIB
        if signalled is not None:  # what the guard let through; the rest came while the victim exited
            at_signal = [a for t, a in trajectory if t <= signalled]
            result["at_signal_mib"] = max(0, floor - at_signal[-1]) / MIB if at_signal else None
            result["lowest_after_ms"] = (seen["lowest_at"] - signalled) * 1000
    result["achieved_gib_s"] = None if seen["rate"] is None else seen["rate"] / GIB
    return result


def term_time(alloc: subprocess.Popen[str]) -> float | None:
    assert alloc.stdout is not None
    for line in alloc.stdout.read().splitlines():
        if line.startswith("term "):
            return float(line.split()[1])
    return None


def run_earlyoom(alloc: subprocess.Popen[str], floor: int) -> dict[str, Any]:
    kib = floor // 1024
    eo = subprocess.Popen(["earlyoom", "-M", f"{kib},{kib - KILL_BELOW_FLOOR // 1024}", "-r", "0",
                           "--prefer", "^benchalloc$"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert eo.stdout is not None
        for line in eo.stdout:  # the banner: earlyoom is polling
            if "SIGKILL when" in line:
                break
        go(alloc)
        killed = wait_dead(alloc)
    finally:
        end(eo)  # at once: with the allocator gone it must not look for another victim
    return {"killed": killed}


def run_sparkd(alloc: subprocess.Popen[str], floor: int) -> dict[str, Any]:
    import anyio

    from sparkd.config import GuardConfig
    from sparkd.guard import Guard

    cfg = GuardConfig(stop_below=floor, kill_below=floor - KILL_BELOW_FLOOR, warn_below=floor + GIB // 2,
                      refuse_start_below=floor, recover_margin=256 * MIB, stop_grace_s=5.0)
    hooks = BenchHooks(alloc.pid)
    guard = Guard(lambda: cfg, hooks)
    hooks.guard = guard

    async def main() -> bool:
        async with anyio.create_task_group() as tg:
            await tg.start(guard.run)
            go(alloc)
            killed = await anyio.to_thread.run_sync(wait_dead, alloc)
            tg.cancel_scope.cancel()
        return killed

    killed = anyio.run(main)
    shutil.rmtree(hooks.folder, ignore_errors=True)
    c = guard.counters
    return {"killed": killed, "signal_at": guard.signals[0].at if guard.signals else None,
            "evidence_ms": hooks.evidence_ms, "sample_us": c.sample_seconds / max(1, c.samples) * 1e6,
            "samples": c.samples, "psi_trigger": guard.sampler.trigger is not None}


class BenchHooks:
    """The daemon's side for the benchmark: the allocator is the vLLM tree; evidence is a small folder
    (incident record, the guard's evidence, meminfo) written before the signal, as the daemon should."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.guard: Any = None
        self.evidence_ms: float | None = None
        self.folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"sparkd-bench-guard-{os.getpid()}"

    def vllm_pids(self) -> set[int]:
        from sparkd.runtime import proctree

        return proctree.tree_pids(self.pid)

    def starting(self) -> bool:
        return False

    def idle(self) -> bool | None:
        return None

    def on_decision(self, decision: Any) -> None:
        pass

    def write_evidence(self, failure: Any, evidence: Any) -> None:
        """Quick, as the guard's README asks: small files, no fsync, no subprocess (dmesg can come after)."""
        from sparkd.state.incidents import incident_record

        started = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        record = incident_record(failure, at=time.time(), config_hash="bench")
        (self.folder / "incident.json").write_text(json.dumps(record, default=str))
        (self.folder / "guard.json").write_text(json.dumps(self.guard.evidence(), default=str))
        shutil.copyfile("/proc/meminfo", self.folder / "meminfo.txt")
        self.evidence_ms = (time.perf_counter() - started) * 1000

    async def stop_vllm(self, failure: Any, grace_s: float) -> None:
        from sparkd.runtime import proctree

        await proctree.terminate_tree(self.pid, grace_s)

    async def kill_vllm(self, failure: Any) -> None:
        pass

    async def planned_restart(self, reason: str) -> None:
        pass


def measure(guard: str, rate: float, distance: int) -> dict[str, Any] | None:
    """One valid run, its floor set from the MemAvailable of the moment; None when no safe run was had."""
    for _ in range(3):
        baseline = settle()
        floor = baseline - distance
        if floor - CAP_BEYOND_FLOOR < SAFE_AVAILABLE:
            print(f"  MemAvailable {baseline / GIB:.1f} GiB is too little for a safe run", file=sys.stderr)
            return None
        result = one_run(guard, rate, floor, (distance + CAP_BEYOND_FLOOR) // MIB)
        # Valid only if the observer saw our approach: someone else's allocation can move the node under
        # the floor before ours starts.
        if result.get("achieved_gib_s") is not None and result.get("reaction_ms") is not None:
            return result
        print(f"  {guard} {rate:g} GiB/s: invalid run (the baseline moved), again", file=sys.stderr)
    return None


# ---- report -----------------------------------------------------------------------------------------


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(runs: list[dict[str, Any]], rates: list[float]) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        row: dict[str, Any] = {"rate_target_gib_s": rate}
        for guard in ("sparkd", "earlyoom"):
            mine = [r for r in runs if r["guard"] == guard and r["rate_target"] == rate]
            row[guard] = {key: median([r.get(key) for r in mine])
                          for key in ("reaction_ms", "overshoot_mib", "at_signal_mib", "lowest_after_ms", "exit_ms",
                                      "achieved_gib_s")}
            row[guard]["runs"] = len(mine)
            row[guard]["missed"] = sum(1 for r in mine if not r.get("killed"))
        for key in ("reaction_ms", "overshoot_mib"):
            s, e = row["sparkd"][key], row["earlyoom"][key]
            row[f"ratio_{key}"] = None if s is None or not e else s / e
        # Run by run (the same run index, one after the other): was sparkd's overshoot below earlyoom's?
        pairs = [(a, b) for a in runs for b in runs if a["guard"] == "sparkd" and b["guard"] == "earlyoom"
                 and a["rate_target"] == b["rate_target"] == rate and a.get("run") == b.get("run")]
        row["paired_runs"] = len(pairs)
        for key, below in (("overshoot_mib", "overshoot_below_runs"), ("at_signal_mib", "at_signal_below_runs")):
            row[below] = sum(a.get(key) is not None and b.get(key) is not None and a[key] < b[key] for a, b in pairs)
        rows.append(row)
    return rows


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Floor: MemAvailable at the start of each run − {meta['distance_gib']:g} GiB (median "
        f"{meta['floor_gib']:.2f} GiB), kill floor 1 GiB under; {meta['runs']} runs per cell, medians. "
        "Reaction = floor crossed → SIGTERM received; overshoot = how far under the floor MemAvailable went; "
        "at the signal = how far under it was when the SIGTERM arrived (what the guard let through; the rest "
        "came while the victim exited, its memory back only some 100s of ms later, and from the rest of the "
        "machine).",
        "",
        "| rate target | achieved (GiB/s) | sparkd reaction (ms) | earlyoom reaction (ms) | ratio | "
        "sparkd overshoot (MiB) | earlyoom overshoot (MiB) | ratio | at the signal, sparkd / earlyoom (MiB) | "
        "sparkd below at the signal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, e = r["sparkd"], r["earlyoom"]
        achieved = median([s["achieved_gib_s"], e["achieved_gib_s"]])
        lines.append(
            f"| {r['rate_target_gib_s']:g} GiB/s | {fmt(achieved, '.2f')} | {fmt(s['reaction_ms'], '.0f')} | "
            f"{fmt(e['reaction_ms'], '.0f')} | {fmt(r['ratio_reaction_ms'], '.2f')} | "
            f"{fmt(s['overshoot_mib'], '.0f')} | {fmt(e['overshoot_mib'], '.0f')} | "
            f"{fmt(r['ratio_overshoot_mib'], '.2f')} | {fmt(s['at_signal_mib'], '.0f')} / "
            f"{fmt(e['at_signal_mib'], '.0f')} | {r['at_signal_below_runs']}/{r['paired_runs']} |")
    lines += ["", f"sparkd sampling cost: {meta['sample_us']:.0f} µs per sample, all sources, wall time under the "
              f"benchmark's load; /proc/meminfo alone, idle: {meta['meminfo_fast_us']:.1f} µs (fd kept open, preadv, "
              f"find) vs {meta['meminfo_naive_us']:.1f} µs (open, read, split); evidence written before the signal "
              f"in {meta['evidence_ms']:.1f} ms."]
    return "\n".join(lines)


def parse_cost() -> tuple[float, float]:
    from sparkd.guard.meminfo import MeminfoReader, parse_meminfo

    reader = MeminfoReader()

    def naive() -> object:
        with open("/proc/meminfo") as handle:
            return parse_meminfo(handle.read())

    n = 5000
    fast = timeit.timeit(reader.read, number=n) / n * 1e6
    slow = timeit.timeit(naive, number=n) / n * 1e6
    reader.close()
    return fast, slow


def bench(args: argparse.Namespace) -> int:
    if shutil.which("earlyoom") is None:
        print("earlyoom is missing: apt-get install -y earlyoom", file=sys.stderr)
        return 2
    rates = [float(r) for r in args.rates.split(",")]
    distance = int(args.distance_gib * GIB)
    fast_us, naive_us = parse_cost()
    runs, started = [], time.monotonic()
    for rate in rates:
        for i in range(args.runs):
            for guard in ("sparkd", "earlyoom") if i % 2 == 0 else ("earlyoom", "sparkd"):
                result = measure(guard, rate, distance)
                if result is None:
                    continue
                result["run"] = i
                runs.append(result)
                print(f"  {guard:8s} {rate:g} GiB/s run {i + 1}: reaction {fmt(result.get('reaction_ms'), '.0f')} ms, "
                      f"overshoot {fmt(result.get('overshoot_mib'), '.0f')} MiB, achieved "
                      f"{fmt(result.get('achieved_gib_s'), '.2f')} GiB/s", file=sys.stderr)
    rows = summarise(runs, rates)
    sparkd_runs = [r for r in runs if r["guard"] == "sparkd"]
    meta = {"floor_gib": (median([r["floor"] for r in runs]) or 0) / GIB, "distance_gib": args.distance_gib,
            "runs": args.runs, "sample_us": median([r.get("sample_us") for r in sparkd_runs]) or 0.0,
            "evidence_ms": median([r.get("evidence_ms") for r in sparkd_runs]) or 0.0,
            "meminfo_fast_us": fast_us, "meminfo_naive_us": naive_us,
            "seconds": time.monotonic() - started, "kernel": os.uname().release}
    print(markdown(rows, meta))
    Path(args.json).write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=2) + "\n")
    print(f"\n(JSON: {args.json}; {meta['seconds']:.0f} s)", file=sys.stderr)
    return 0


def main() -> int:
    sys.path.insert(0, str(HERE.parents[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "alloc":
        alloc_main(float(sys.argv[2]), int(sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "watch":
        watch_main(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    import logging

    import structlog

    # The guard logs every decision; the benchmark prints its own lines.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rates", default="0.5,2,4", help="GiB/s, comma-separated")
    parser.add_argument("--distance-gib", type=float, default=2.0, help="floor = MemAvailable minus this")
    parser.add_argument("--json", default=str(Path(tempfile.gettempdir()) / "sparkd-bench-guard.json"))
    return bench(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
