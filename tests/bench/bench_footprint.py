"""Benchmark: what an idle sparkd costs, beside supervisord and earlyoom; and its /metrics latency.

    .venv/bin/python tests/bench/bench_footprint.py [--seconds 60] [--scrape-seconds 30] [--recorder-seconds 120]
        [--against TREE] [--phases imports,features,footprint,scrape,recorder] [--standin-threads N] [--json out.json]

Footprint: sparkd with its shipped defaults (health probe every 5 s with a vLLM metrics scrape, generation
canary every 60 s, the 1 s ticker, /metrics served, the memory guard sampling every second when far from its
floors; the floors themselves set for this small machine, see benchkit.GUARD_FLOORS) supervises a ready
stand-in; beside it, at the same time, supervisord supervises the same stand-in and earlyoom runs with
Debian's packaged arguments (``-r 3600``, plus ``--dryrun`` on this shared machine). For each supervisor's
own PID (not its children): CPU time over the window as % of one core (psutil ``cpu_times``, user +
system, and the scheduler's own count from the threads' ``schedstat``), RSS sampled every second, and its
wake-ups (voluntary context switches of all its threads) per second. ``--against TREE``: a second sparkd, run from
another checkout's ``sparkd/`` (``git archive <commit> | tar -x -C TREE``), supervises a stand-in of its own in the
same window, so a change is measured against what it changed under the same load. ``--standin-threads N``: every
stand-in process keeps N idle threads, as a real vLLM's processes keep torch's, NCCL's and CUDA's pools (a GPU host's
vLLM runs hundreds of threads; the stand-in by default a few).

Features (issue 35): what each feature adds to a ready daemon's memory and modules, each in a fresh interpreter over
sparkd's fakes: a single node with the flight recorder off (the base), then a group's head (+group), the recorder
(+recorder), a GPU read through NVML (+GPU: the bindings imported, a fake NVML's devices read).

Scrape: then a second sparkd, its guard sampling at its fastest throughout (``max_interval_s`` set to the
default ``min_interval_s``, 5 ms), gets ``GET /metrics`` 20 times a second for the scrape window, each on a
fresh loopback connection, beside the same on prometheus_client's own ``start_http_server`` (the reference
Python exporter: process, platform and GC collectors) in its own process, interleaved 25 ms apart.
Latency = connect to the last byte of the body.

Recorder (issue 29): two more sparkd side by side, one with the flight recorder (the shipped default) and one
without (``[recorder] enabled = false``); its cost is the difference in CPU (% of one core) and median RSS over the
same window (from each process's threads' ``schedstat``), and what the recorder counts of itself (the CPU time of
its ticks on the loop and of its writer thread, ``time.thread_time``), which two daemons' noise cannot blur.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from benchkit import (
    Owned,
    ShmLedger,
    bench_parser,
    end_process,
    free_port,
    log,
    median,
    percentile,
    render_toml,
    rendered_launch,
    run_bench,
    sparkd_config,
    standin_env,
    unique_prefix,
    wait_for,
    wait_healthy,
)
from peers import SparkdPeer, SupervisordPeer

from sparkd.recorder.ring import read_ring

MIB = 1024 * 1024
SETTLE_S = 5.0  # after everything is ready, before the window opens
SCRAPE_RATE_HZ = 20
GUARD_FASTEST_S = 0.005  # the guard's min_interval_s, made its max too: it samples at its fastest throughout
# Debian's packaged arguments (/etc/default/earlyoom), and --dryrun: this machine is shared, and the poll loop
# (what the footprint measures) is the same whether it may kill or not.
EARLYOOM = ["earlyoom", "-r", "3600", "--dryrun"]
PEER_EXPORTER = ("import time; from prometheus_client import start_http_server; "
                 "start_http_server({port}, addr='127.0.0.1'); time.sleep(1e9)")


# What the daemon imports of each dependency (pydantic's BaseModel lives in pydantic.main, loaded on first use;
# the control API parses HTTP/1.1 with h11), then two it does not import: httpx (sparkctl) and the docker SDK
# (the docker runtimes).
DEPENDENCIES = ("anyio", "psutil", "pydantic.main", "structlog", "click", "h11", "prometheus_client", "httpx",
                "docker")
DAEMON_MODULES = ("sparkd.cli.sparkd", "sparkd.daemon.app")  # what `sparkd run` imports before it runs
# Each probe keeps rich out as `sparkd run` does (structlog would import it: sparkd/cli/sparkd.py).
IMPORT_PROBE = """
import importlib, json, sys
sys.modules.setdefault("rich", None)
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096 / 1048576
before, count = rss(), len(sys.modules)
for name in sys.argv[1:] or json.load(sys.stdin):  # from stdin: all of them, each one that imports at all
    try:
        importlib.import_module(name)
    except Exception:
        if sys.argv[1:]:
            raise
print(json.dumps([before, rss() - before, len(sys.modules) - count,
                  sorted(name for name, module in sys.modules.items() if module is not None)]))
"""


def import_costs() -> dict[str, Any]:
    """What a daemon at rest pays for its imports: the RSS each dependency adds to a fresh interpreter on its
    own (shared pieces, asyncio say, count in each) and whether the daemon imports it at all; everything the
    daemon imports but its own modules, together (the floor under any daemon built on these pieces); and all
    the daemon's imports."""
    def probe(*modules: str, each_of: list[str] | None = None) -> tuple[float, float, int, set[str]]:
        out = subprocess.run([sys.executable, "-c", IMPORT_PROBE, *modules], capture_output=True, text=True,
                             input=json.dumps(each_of), check=True, timeout=120).stdout
        bare, mib, count, names = json.loads(out)
        return bare, mib, count, set(names)

    bare, daemon, modules, loaded = probe(*DAEMON_MODULES)
    each = {}
    for module in DEPENDENCIES:
        _, mib, count, _ = probe(module)
        each[module.split(".")[0]] = {"rss_mib": round(mib, 2), "modules": count, "module": module,
                                      "in_daemon": module in loaded}
    # The floor: every module `sparkd run` imports but sparkd's own, in one interpreter.
    _, deps, deps_modules, _ = probe(each_of=sorted(name for name in loaded if not name.startswith("sparkd")))
    return {"bare_mib": round(bare, 2), "each": each, "daemon_mib": round(daemon, 2), "daemon_modules": modules,
            "deps_mib": round(deps, 2), "deps_modules": deps_modules}


def thread_counters(pid: int) -> dict[int, tuple[int, int, str]]:
    """Each live thread of ``pid``: (nanoseconds it has run, ``schedstat``; its voluntary context switches: how often
    it went to sleep and woke up; its name)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, StopIteration, IndexError):
            ns = int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text().splitlines()
            line = next(x for x in status if x.startswith("voluntary_ctxt"))
            name = next(x for x in status if x.startswith("Name:")).split(maxsplit=1)[1]
            out[int(task.name)] = (ns, int(line.split()[1]), name)
    return out


class ThreadLedger:
    """A process's threads' run time and wake-ups over a window, seen at every sample: a thread that ends inside the
    window keeps what it did up to the last sample that saw it, one born inside counts from zero (summing the live
    threads at both ends alone lost the work of a worker thread that ended meanwhile)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first = thread_counters(pid)
        self.last = dict(self.first)

    def see(self) -> None:
        self.last.update(thread_counters(self.pid))

    def by_thread(self) -> dict[str, tuple[int, int]]:
        """(ns run, wake-ups) in the window by thread: the main thread, then the others by name and thread id (Python
        threads carry the process's name; the born-in-window ones are marked)."""
        out: dict[str, tuple[int, int]] = {}
        for tid, (ns, woke, name) in self.last.items():
            ns0, woke0, _ = self.first.get(tid, (0, 0, name))
            key = "main" if tid == self.pid else f"{name} {tid}" + ("" if tid in self.first else " (new)")
            out[key] = (ns - ns0, woke - woke0)
        return out

    def totals(self) -> tuple[int, int]:
        split = self.by_thread().values()
        return sum(ns for ns, _ in split), sum(woke for _, woke in split)


def sample(procs: dict[str, psutil.Process], seconds: float) -> dict[str, dict[str, Any]]:
    """CPU % of one core over the window (psutil's ticks and the scheduler's ns), RSS every second and wake-ups a
    second, for each process."""
    cpu0 = {name: p.cpu_times() for name, p in procs.items()}
    ledgers = {name: ThreadLedger(p.pid) for name, p in procs.items()}
    rss: dict[str, list[float]] = {name: [] for name in procs}
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for name, proc in procs.items():
            rss[name].append(proc.memory_info().rss / MIB)
            ledgers[name].see()
        time.sleep(1.0)
    wall = time.monotonic() - start
    out = {}
    for name, proc in procs.items():
        t0, t1 = cpu0[name], proc.cpu_times()
        ledgers[name].see()
        ns, woke = ledgers[name].totals()
        busy = (t1.user - t0.user) + (t1.system - t0.system)
        out[name] = {"pid": proc.pid, "cpu_pct": 100.0 * busy / wall, "cpu_s": busy, "window_s": wall,
                     "cpu_pct_schedstat": 100.0 * ns / 1e9 / wall, "wakeups_per_s": woke / wall,
                     "threads_seen": len(ledgers[name].last),
                     "by_thread": {n: {"cpu_ms": round(ns / 1e6, 1), "wakeups": woke}
                                   for n, (ns, woke) in ledgers[name].by_thread().items()},
                     "rss_mib_median": median(rss[name]), "rss_mib_max": max(rss[name]), "samples": len(rss[name])}
    return out


def scrape_once(port: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"/metrics on {port}: HTTP {response.status}")
    finally:
        conn.close()
    return (time.perf_counter() - t0) * 1000, len(body)


def scrape(targets: dict[str, int], seconds: float) -> dict[str, dict[str, Any]]:
    """Each target at SCRAPE_RATE_HZ, the targets evenly interleaved within each period."""
    period = 1.0 / SCRAPE_RATE_HZ
    offset = period / len(targets)
    lat: dict[str, list[float]] = {name: [] for name in targets}
    size: dict[str, int] = {}
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        for i, (name, port) in enumerate(targets.items()):
            time.sleep(max(0.0, start + n * period + i * offset - time.monotonic()))
            ms, size[name] = scrape_once(port)
            lat[name].append(ms)
        n += 1
    return {name: {"scrapes": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99),
                   "max_ms": max(v), "bytes": size[name], "rate_hz": len(v) / (time.monotonic() - start)}
            for name, v in lat.items()}


def start_sparkd(tmp: Path, *, tree: Path | None = None, idle_threads: int = 0,
                 **sections: dict[str, Any]) -> tuple[SparkdPeer, int, int]:
    """``tree``: run the sparkd of that checkout (its ``sparkd/`` first on the path) instead of this one;
    ``idle_threads``: the stand-in's processes keep that many idle threads each (a real vLLM's thread pools)."""
    port, metrics_port = free_port(), free_port()
    cfg = sparkd_config(tmp, port, standin_env(unique_prefix(), idle_threads=idle_threads), api_port=metrics_port,
                        **sections)
    peer = SparkdPeer(tmp, cfg)
    # the other tree's sparkd first on the path, the interpreter's own (a host's --target folder, say) after it
    path = os.pathsep.join(p for p in (str(tree) if tree else "", os.environ.get("PYTHONPATH", "")) if p)
    peer.daemon.start(env={"PYTHONPATH": path} if tree is not None else None)
    return peer, port, metrics_port


def footprint_phase(tmp: Path, seconds: float, owned: Owned, ledger: ShmLedger,
                    against: Path | None = None, idle_threads: int = 0) -> dict[str, Any]:
    sparkd = supervisord = earlyoom = before = None
    try:
        sparkd, port, _ = start_sparkd(tmp / "sparkd", idle_threads=idle_threads)
        if against is not None:
            before, before_port, _ = start_sparkd(tmp / "sparkd-before", tree=against, idle_threads=idle_threads)
        peer_port = free_port()
        render = tmp / "render.toml"
        render.write_text(render_toml(sparkd_config(tmp, peer_port,
                                                    standin_env(unique_prefix(), idle_threads=idle_threads))))
        supervisord = SupervisordPeer(tmp / "supervisord", {"standin": rendered_launch(render)}).start()
        with open(tmp / "earlyoom.log", "ab") as out:
            earlyoom = subprocess.Popen(EARLYOOM, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for p in (port, peer_port, *((before_port,) if before is not None else ())):
            if wait_healthy(p, 120) is None:
                named = {port: "sparkd's", peer_port: "supervisord's", **({before_port: "the other tree's sparkd's"}
                                                                          if before is not None else {})}
                raise RuntimeError(f"{named[p]} stand-in on {p} never became ready")
        for daemon in (sparkd, *((before,) if before is not None else ())):
            daemon.daemon.wait_state("ready", timeout=60)
            ledger.note(owned.add_tree(daemon.main_pid()))
        ledger.note(owned.add_tree(supervisord.main_pid()))
        time.sleep(SETTLE_S)
        procs = {"sparkd": psutil.Process(sparkd.pid), "supervisord": psutil.Process(supervisord.pid),
                 "earlyoom": psutil.Process(earlyoom.pid)}
        if before is not None:
            procs["sparkd_against"] = psutil.Process(before.pid)
        load = os.getloadavg()
        log(f"footprint: sampling {', '.join(procs)} for {seconds:.0f} s (load {load[0]:.2f})")
        out: dict[str, Any] = sample(procs, seconds)
        out["load"] = {"before": load, "after": os.getloadavg()}
        return out
    finally:
        for peer in (sparkd, supervisord, before):
            if peer is not None:
                peer.close()
        if earlyoom is not None:
            end_process(earlyoom)


def scrape_phase(tmp: Path, seconds: float, owned: Owned, ledger: ShmLedger) -> dict[str, Any]:
    sparkd = exporter = None
    try:
        sparkd, port, metrics_port = start_sparkd(tmp / "sparkd-fast", guard={"max_interval_s": GUARD_FASTEST_S})
        exporter_port = free_port()
        exporter = subprocess.Popen([sys.executable, "-c", PEER_EXPORTER.format(port=exporter_port)],
                                    start_new_session=True)
        if wait_healthy(port, 120) is None:
            raise RuntimeError("the stand-in never became ready")
        sparkd.daemon.wait_state("ready", timeout=60)
        ledger.note(owned.add_tree(sparkd.main_pid()))
        wait_for(lambda: _answers(exporter_port), 30, "the prometheus_client exporter")
        time.sleep(SETTLE_S)
        body = _metrics_text(metrics_port)
        proc = psutil.Process(sparkd.pid)
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        log(f"scrape: /metrics at {SCRAPE_RATE_HZ}/s for {seconds:.0f} s, sparkd (guard sampling every "
            f"{GUARD_FASTEST_S * 1000:.0f} ms) and prometheus_client")
        result = scrape({"sparkd": metrics_port, "prometheus_client": exporter_port}, seconds)
        cpu1, wall = proc.cpu_times(), time.monotonic() - t0
        busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        return {"targets": result, "sparkd_cpu_pct_during": 100.0 * busy / wall,
                "guard_metrics_present": any(line.startswith("sparkd_guard") for line in body.splitlines()),
                "guard_interval_s": GUARD_FASTEST_S}
    finally:
        if sparkd is not None:
            sparkd.close()
        if exporter is not None:
            end_process(exporter)


# One ready daemon per feature, in a fresh interpreter over sparkd's fakes (tests/unit/loop_harness.py): its RSS once
# ready and the modules it holds (rich kept out as `sparkd run` does).
FEATURE_PROBE = """
import json, sys, gc
sys.modules.setdefault("rich", None)
sys.path.insert(0, sys.argv[3])
import anyio
from pathlib import Path
import loop_harness
from sparkd.testing import FakeClock, FakeRuntime, new_event_loop


def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


async def main(feature, tmp):
    extra, options = {}, {}
    if feature == "+group":
        extra = {"node": {"role": "head"}, "cluster": {"master_addr": "127.0.0.1", "nnodes": 2,
                                                        "peers": ["127.0.0.1:1"]}}
    elif feature == "+recorder":
        extra = {"recorder": {"enabled": True, "settle_s": 0, "reboot_after_falls": 0}}
    elif feature == "+GPU":
        import pynvml  # noqa: F401  (the bindings a host with a driver loads)
        from sparkd.host.gpu import nvml
        from sparkd.host.gpu.fake import FakeDevice, FakeNvml
        reader = nvml.NvmlReader(FakeNvml([FakeDevice("GPU-0"), FakeDevice("GPU-1")]))

        async def gpus():
            return reader.read()
        options["gpus"] = gpus
    cfg = loop_harness.config(Path(tmp), **extra)
    async with loop_harness.running(cfg, FakeRuntime(), FakeClock(), **options) as node:
        if feature != "+group":  # a head with no worker to start waits in backoff
            await node.until_state("ready")
        await node.until(lambda: node.clock.t > 1030)
        gc.collect()
        names = sorted(n for n, m in sys.modules.items() if m is not None)
        print("FEATURE", json.dumps([rss(), len(names), [n for n in names if n.startswith("sparkd")]]))

anyio.run(main, sys.argv[1], sys.argv[2], backend_options={"loop_factory": new_event_loop})
"""
FEATURES = ("base", "+group", "+recorder", "+GPU")


def feature_costs(tmp: Path) -> dict[str, Any]:
    """Each feature's daemon, ready: RSS MiB and modules, and the sparkd modules it adds to the base's."""
    unit = Path(__file__).resolve().parents[1] / "unit"
    out: dict[str, Any] = {}
    for feature in FEATURES:
        where = tmp / f"feature-{feature.strip('+')}"
        where.mkdir()
        run = subprocess.run([sys.executable, "-c", FEATURE_PROBE, feature, str(where), str(unit)],
                             capture_output=True, text=True, check=True, timeout=180)
        line = next(x for x in run.stdout.splitlines() if x.startswith("FEATURE "))
        mib, modules, own = json.loads(line.removeprefix("FEATURE "))
        out[feature] = {"rss_mib": round(mib, 2), "modules": modules, "sparkd_modules": own}
    base = set(out["base"]["sparkd_modules"])
    for feature in FEATURES:
        out[feature]["adds"] = sorted(set(out[feature].pop("sparkd_modules")) - base)
    return out


def _recorder_cpu_s(peer: SparkdPeer) -> float:
    """The recorder's own count of its CPU: its ticks on the loop and its writer thread (thread_time)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(peer.daemon.socket)), timeout=10) as client:
        return float(client.get("http://sparkd/v1/status").json()["result"]["recorder"]["cpu_s"])


def recorder_phase(tmp: Path, seconds: float, owned: Owned, ledger: ShmLedger) -> dict[str, Any]:
    """Issue 29's row: two sparkd side by side, the same shipped defaults, one with the flight recorder (a record
    a second, fdatasync at most once a second) and one without; the cost is the difference, same window."""
    daemons: dict[str, SparkdPeer] = {}
    try:
        for name, recorder in (("on", {}), ("off", {"enabled": False})):
            daemons[name], port, _ = start_sparkd(tmp / f"recorder-{name}", recorder=recorder)
            if wait_healthy(port, 120) is None:
                raise RuntimeError(f"the stand-in of the recorder-{name} daemon never became ready")
        for peer in daemons.values():
            peer.daemon.wait_state("ready", timeout=60)
            ledger.note(owned.add_tree(peer.main_pid()))
        time.sleep(SETTLE_S)
        log(f"recorder: sampling sparkd with and without the flight recorder for {seconds:.0f} s")
        ring = daemons["on"].daemon.state_dir / "recorder.ring"
        records, own = len(read_ring(ring)), _recorder_cpu_s(daemons["on"])
        both = sample({name: psutil.Process(peer.pid) for name, peer in daemons.items()}, seconds)
        for name in daemons:  # the scheduler's own count, in ns (cpu_times ticks at 10 ms)
            both[name]["cpu_pct"] = both[name]["cpu_pct_schedstat"]
        window = both["on"]["window_s"]
        return {**both, "cpu_pct_cost": both["on"]["cpu_pct"] - both["off"]["cpu_pct"],
                "own_cpu_pct": 100.0 * (_recorder_cpu_s(daemons["on"]) - own) / window,
                "rss_mib_cost": both["on"]["rss_mib_median"] - both["off"]["rss_mib_median"],
                "records": len(read_ring(ring)) - records}
    finally:
        for peer in daemons.values():
            peer.close()


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sparkd-bench-footprint-"))
    owned, ledger = Owned(), ShmLedger()
    started = time.monotonic()
    phases = set(args.phases.split(","))
    imports = features = footprint = scrapes = recorder = None
    against = Path(args.against).resolve() if args.against else None
    try:
        if "imports" in phases:
            imports = import_costs()
        if "features" in phases:
            features = feature_costs(tmp)
        if "footprint" in phases:
            footprint = footprint_phase(tmp, args.seconds, owned, ledger, against, args.standin_threads)
        if "scrape" in phases:
            scrapes = scrape_phase(tmp, args.scrape_seconds, owned, ledger)
        if "recorder" in phases:
            recorder = recorder_phase(tmp, args.recorder_seconds, owned, ledger)
    finally:
        left = owned.kill_all()
        ledger.cleanup()
        if left:
            log(f"footprint: ended {left} leftover process(es) of ours")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"footprint": footprint, "scrape": scrapes, "imports": imports, "features": features,
            "recorder": recorder, "seconds": round(time.monotonic() - started, 1)}


def _answers(port: int) -> bool:
    try:
        scrape_once(port)
        return True
    except (OSError, RuntimeError, http.client.HTTPException):
        return False


def _metrics_text(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()


def main() -> int:
    parser = bench_parser(__doc__, "bench-footprint.json")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-seconds", type=float, default=30.0)
    parser.add_argument("--recorder-seconds", type=float, default=120.0)
    parser.add_argument("--against", default=None, help="another checkout whose sparkd runs beside this one's")
    parser.add_argument("--phases", default="imports,features,footprint,scrape,recorder")
    parser.add_argument("--standin-threads", type=int, default=0,
                        help="idle threads each stand-in process keeps in the footprint phase (a real vLLM's pools)")
    return run_bench(parser, bench)


if __name__ == "__main__":
    sys.exit(main())
