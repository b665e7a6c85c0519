"""Where a resting sparkd's CPU goes: the loop thread's profile over a window at rest.

    .venv/bin/python tests/bench/idle_profile.py [--settle 20] [--seconds 60] [--top 25] [--wakes] [--json out.json]

It starts a real ``sparkd run`` with the shipped defaults supervising the vLLM stand-in (as bench_footprint.py
does) under a ``sitecustomize`` that profiles the main thread (the anyio loop: every task but the recorder's
writer thread and the worker threads) with cProfile from its start, timed by the thread's own CPU clock. Once vLLM
is ready and ``--settle`` seconds more have passed, it marks the window's start, ``--seconds`` later its end; the
daemon's profile thread takes a snapshot at each mark (the only other thing it does: look for the marks every
0.2 s), and the difference is printed: the functions by cumulative and by own time, their calls in the window,
and the process's CPU in the window. cProfile slows what it measures (a CPU-clock read per call: several times
here): read the figures as shares, bench_footprint.py's as costs.

``--wakes``: instead of the profile, who woke the loop in the window: every callback the loop ran, by what it was
(a task's step named by its coroutine's outermost and innermost frames, or the callback's name), and the selector's
waits (each a turn of the loop). Each turn costs the loop's own machinery besides the work, so a wait that takes
several turns (a task group's spawn and cancel, a deadline's delivered cancellation) shows here. Each callback's CPU is
counted too (the loop thread's own clock around it, unprofiled: the cost of each kind of wake-up as it runs), and
the loop thread's whole CPU in the window: in its turns' work and in its waits (the selector and ``epoll_wait``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
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

PROFILER = '''
import cProfile, json, os, threading, time
_dir = os.environ.pop("SPARKD_IDLE_PROFILE_DIR", None)  # sparkd's alone: the vLLM it starts is not profiled
_prof = cProfile.Profile(time.thread_time)  # the loop thread's CPU, not the wall clock (GIL waits)


def _threads():
    """Every thread's CPU so far (the scheduler's ns, /proc/self/task/*/schedstat), by its Python name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        name = names.get(int(tid), "native")  # a thread Python did not start (a library's own: NVML's)
        if name.startswith("AnyIO worker thread"):
            name = "AnyIO worker threads"
        key = f"{name} ({tid})" if name in ("native",) else name
        out[key] = out.get(key, 0) + ns
    return out


def _snapshot():
    _prof.snapshot_stats()  # the main thread's entries, read under the GIL
    return ({k: v[:4] for k, v in _prof.stats.items()}, time.process_time(), time.monotonic(), _threads())


def _watch():
    taken = {}
    for mark in ("start", "end"):
        while not os.path.exists(os.path.join(_dir, mark)):
            time.sleep(0.2)
        taken[mark] = _snapshot()
    (a, cpu_a, t_a, th_a), (b, cpu_b, t_b, th_b) = taken["start"], taken["end"]
    threads = {name: (ns - th_a.get(name, 0)) / 1e9 for name, ns in th_b.items()}
    rows = []
    for key, (cc, nc, tt, ct) in b.items():
        _, nc0, tt0, ct0 = a.get(key, (0, 0, 0.0, 0.0))
        if nc > nc0:
            rows.append({"where": f"{key[0]}:{key[1]}({key[2]})", "calls": nc - nc0, "own_s": tt - tt0,
                         "cum_s": ct - ct0})
    with open(os.path.join(_dir, "profile.json.part"), "w") as out:
        json.dump({"window_s": t_b - t_a, "process_cpu_s": cpu_b - cpu_a, "threads_cpu_s": threads, "rows": rows},
                  out)
    os.rename(os.path.join(_dir, "profile.json.part"), os.path.join(_dir, "profile.json"))  # whole, or not there


if _dir is not None:
    threading.Thread(target=_watch, name="idle-profile", daemon=True).start()
    _prof.enable()
'''


WAKES = r'''
import asyncio, asyncio.events, collections, json, os, selectors, threading, time
_dir = os.environ.pop("SPARKD_IDLE_PROFILE_DIR", None)
_counts, _cpu, _on = collections.Counter(), collections.Counter(), [False]
_turns = [0, 0, 0.0, 0.0]  # turns, turns with I/O ready, CPU between selects, CPU inside them


def _who(callback):
    owner = getattr(callback, "__self__", None)
    if not isinstance(owner, asyncio.Task):
        return "callback " + getattr(callback, "__qualname__", type(callback).__name__)
    frames, coro = [], owner.get_coro()
    while coro is not None and len(frames) < 16:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        if frame.f_code.co_qualname != "TaskHandle._run_coro":  # anyio's wrapper of every task
            frames.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "task " + " > ".join(frames[:1] + frames[-2:]) if frames else "task ?"


def _install():
    run, select = asyncio.events.Handle._run, selectors.EpollSelector.select
    last = [None]  # the thread's CPU clock when the last select returned

    def counted_run(self):
        if not _on[0]:
            return run(self)
        who = _who(self._callback)
        began = time.thread_time()
        try:
            return run(self)
        finally:
            _counts[who] += 1
            _cpu[who] += time.thread_time() - began

    def counted_select(self, timeout=None):
        began = time.thread_time()
        if _on[0] and last[0] is not None:
            _turns[2] += began - last[0]  # the turn's work: callbacks and the loop's own
        ready = select(self, timeout)
        last[0] = time.thread_time()
        if _on[0]:
            _turns[0] += 1
            _turns[1] += bool(ready)
            _turns[3] += last[0] - began  # the wait's own CPU: the selector and epoll_wait
        return ready

    asyncio.events.Handle._run = counted_run
    selectors.EpollSelector.select = counted_select


def _watch():
    while not os.path.exists(os.path.join(_dir, "start")):
        time.sleep(0.2)
    _on[0], started, cpu = True, time.monotonic(), time.process_time()
    while not os.path.exists(os.path.join(_dir, "end")):
        time.sleep(0.2)
    _on[0] = False
    out = {"window_s": time.monotonic() - started, "process_cpu_s": time.process_time() - cpu, "turns": _turns[0],
           "turns_with_io": _turns[1], "loop_work_cpu_s": _turns[2], "loop_select_cpu_s": _turns[3],
           "wakes": _counts.most_common(), "wake_cpu_s": dict(_cpu)}
    with open(os.path.join(_dir, "profile.json.part"), "w") as f:
        json.dump(out, f)
    os.rename(os.path.join(_dir, "profile.json.part"), os.path.join(_dir, "profile.json"))


if _dir is not None:
    _install()
    threading.Thread(target=_watch, name="idle-profile", daemon=True).start()
'''


def short(where: str) -> str:
    for root in (str(Path(__file__).resolve().parents[2]) + "/", sys.prefix + "/", sys.base_prefix + "/"):
        where = where.replace(root, "")
    return where


def report_wakes(profile: dict[str, Any], top: int) -> str:
    window = profile["window_s"]
    minute = 60 / window
    work, waits, cpu = profile["loop_work_cpu_s"], profile["loop_select_cpu_s"], profile["wake_cpu_s"]
    lines = [f"window {window:.1f} s; the process's CPU in it {profile['process_cpu_s'] * 1000:.0f} ms (counted); "
             f"the loop's turns {profile['turns']} ({profile['turns'] / window:.2f}/s), "
             f"{profile['turns_with_io']} with I/O ready",
             f"the loop thread's CPU a minute: {1000 * (work + waits) * minute:.1f} ms ({1000 * work * minute:.1f} "
             f"in its turns' work, of which callbacks {1000 * sum(cpu.values()) * minute:.1f}; "
             f"{1000 * waits * minute:.1f} in its waits)", "",
             "callbacks the loop ran (a minute's worth: how many, their CPU in ms, what):"]
    for who, n in profile["wakes"][:top]:
        lines.append(f"  {n * minute:7.1f}  {1000 * cpu.get(who, 0.0) * minute:7.2f}  {who}")
    return "\n".join(lines)


def report(profile: dict[str, Any], top: int) -> str:
    rows = profile["rows"]
    window = profile["window_s"]
    lines = [f"window {window:.1f} s; the process's CPU in it {profile['process_cpu_s'] * 1000:.0f} ms "
             f"({100 * profile['process_cpu_s'] / window:.3f} % of a core, profiled)"]
    threads = profile.get("threads_cpu_s", {})
    if threads:
        lines.append("\nby thread (ms in the window, the scheduler's; the main thread runs the loop, profiled):")
        for name, cpu in sorted(threads.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {cpu * 1000:8.1f}  {name}")
    for title, key in (("by cumulative time", "cum_s"), ("by own time", "own_s")):
        lines.append(f"\n{title} (ms in the window, calls):")
        for r in sorted((r for r in rows if "epoll" not in r["where"] and "selectors.py" not in r["where"]),
                        key=lambda r: -r[key])[:top]:
            lines.append(f"  {r['cum_s'] * 1000:8.1f} cum {r['own_s'] * 1000:7.1f} own {r['calls']:6d}  "
                         f"{short(r['where'])}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds at ready before the window")
    parser.add_argument("--seconds", type=float, default=60.0, help="the window")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", default=None)
    parser.add_argument("--wakes", action="store_true", help="who woke the loop, instead of the profile")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-idle-profile-"))
    owned, ledger = Owned(), ShmLedger()
    site, marks = tmp / "site", tmp / "marks"
    site.mkdir()
    marks.mkdir()
    (site / "sitecustomize.py").write_text(WAKES if args.wakes else PROFILER)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "SPARKD_IDLE_PROFILE_DIR": str(marks)}
    port = free_port()
    peer = SparkdPeer(tmp / "sparkd", sparkd_config(tmp / "sparkd", port, standin_env(unique_prefix())))
    try:
        peer.daemon.start(env=env)
        if wait_healthy(port, 120) is None:
            raise RuntimeError("the stand-in never became ready")
        peer.daemon.wait_state("ready", timeout=60)
        ledger.note(owned.add_tree(peer.main_pid()))
        time.sleep(args.settle)
        load = os.getloadavg()
        log(f"profiling the loop thread for {args.seconds:.0f} s (load {load[0]:.2f})")
        (marks / "start").touch()
        time.sleep(args.seconds)
        (marks / "end").touch()
        deadline = time.monotonic() + 30
        while not (marks / "profile.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        profile = json.loads((marks / "profile.json").read_text())
    finally:
        peer.close()
        owned.kill_all()
        ledger.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"host: {os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in load)} at the window's start")
    print(report_wakes(profile, args.top) if args.wakes else report(profile, args.top))
    if args.json:
        write_json(args.json, {"load": load, **profile})
    return 0


if __name__ == "__main__":
    sys.exit(main())
