"""The faults the soak gives the daemons, one function each: ``(pair, params, ledger) -> note``.

Each acts, then returns; the runner waits for the recovery. What a fault itself can see going wrong (a client
that got a traceback, a control API that did not answer, a frozen rank left behind) goes into the ledger. A
fault that cannot run on this machine now raises :class:`Skipped` with the reason. The stand-in's run-time
faults are in :mod:`wedges`, the broken config in :mod:`reloads`; :mod:`catalogue` holds the table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import httpx
import psutil
from invariants import Ledger
from pair_harness import FLOOD_HOLDER, Intruder
from soakpair import SoakPair, stop_tree
from test_logfile import FLOOD  # as vLLM floods: one flushed write per line

PY = sys.executable
RAW_LOG_BOUND_MIB = 64  # the reader truncates the raw file past 8 MiB; this leaves room for a starved reader
API_BOUND_S = 2.0  # issue 16: a flood never delays the control API by more than a second (2 s: a shared CI box)


class Skipped(Exception):
    """The fault cannot run here now (the message says why); nothing was done."""


def ctl(pair: SoakPair, node: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return pair.daemons[node].ctl(*args, timeout=timeout)


def api_latency(pair: SoakPair, node: str, ledger: Ledger, during: str) -> float:
    """Time one GET /v1/status on the node's control socket; no answer, or a slow one, is a violation."""
    begun = time.monotonic()
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(pair.daemons[node].socket)), timeout=30) as client:
            answer = client.get("http://sparkd/v1/status")
    except httpx.HTTPError as exc:
        ledger.add(f"{node}: the control API did not answer during {during} ({type(exc).__name__})")
        return time.monotonic() - begun
    took = time.monotonic() - begun
    if answer.status_code != 200:
        ledger.add(f"{node}: the control API answered {answer.status_code} during {during}")
    elif took > API_BOUND_S:
        ledger.add(f"{node}: the control API took more than {API_BOUND_S:.0f} s to answer during {during}")
    pair.latencies.append(took)
    return took


def vllm_sigkill(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    pid = pair.rank_pid(params["node"])
    if pid is None:
        return "no rank to kill"
    pair.before_crash = {name: pair.rank_pid(name) for name in pair.daemons}
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return f"{params['node']} rank {pid} was already gone"
    return f"SIGKILL {params['node']} rank {pid}"


def rank_sigstop(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    pid = pair.rank_pid(params["node"])
    if pid is None:
        return "no rank to stop"
    frozen = stop_tree(pid)
    pair.frozen = frozen
    return f"SIGSTOP {params['node']} rank {pid} ({len(frozen)} processes)"


def after_sigstop(pair: SoakPair, ledger: Ledger) -> None:
    """After the recovery: the frozen rank must be gone (sparkd killed it); else end it ourselves."""
    left = [p for p in pair.frozen if _alive(p)]
    if left:
        ledger.add("a frozen (SIGSTOPped) rank was left behind after the recovery")
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
    pair.frozen = []


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def link_cut(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """The link down, then up. ``crash_after``: once the pair is ready again, a rank crashes at once — a real
    failure right after a run of waits for the peer (which must not count toward the limits)."""
    pair.link.cut()
    time.sleep(params["down_s"])
    pair.link.restore()
    # A poll sent during the cut is answered, or times out, up to peer_timeout_s after it (TCP's retransmissions
    # back off past the restore): until then the cut's peer_lost may still come, and would be laid at the next fault.
    cluster = pair.head.config["cluster"]
    time.sleep(float(cluster.get("peer_timeout_s", 5.0)) + float(cluster.get("peer_poll_s", 2.0)))
    note = f"link down {params['down_s']} s"
    if not params.get("crash_after"):
        return note
    outcome = pair.settle()
    if outcome != "ready":
        return f"{note}, then {outcome} (no crash)"
    return f"{note}, then {vllm_sigkill(pair, {'node': 'head'}, ledger)} as soon as the pair was ready"


def daemon_sigkill(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    name = params["node"]
    pair.expected_exit.add(name)
    if pair.webhooks is not None:
        pair.webhooks.before_kill(name, pair.status(name))
    pair.daemons[name].kill()
    pair.killed_daemon = (name, time.time())
    time.sleep(0.5)
    pair.start(name)
    return f"SIGKILL {name} daemon, started a new one"


def after_daemon_sigkill(pair: SoakPair, ledger: Ledger) -> None:
    """After the recovery: the ring the kill left reads, and `sparkctl postmortem` finds the silence at the kill."""
    name, killed_at = pair.killed_daemon
    done = ctl(pair, name, "--json", "postmortem", "--local", "--since", "15m", timeout=60)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        ledger.add("sparkctl postmortem did not answer after a daemon kill", f"{name}: {done.stderr[-300:]}")
        return
    if not any(abs(f["at"] - killed_at) < 3.0 for f in report.get("findings", [])):
        ledger.add("sparkctl postmortem found no silence at a daemon kill", f"{name}: {report.get('headline')}")


STORM_ORDERS = [("restart",), ("stop", "start"), ("restart", "restart"), ("start",), ("stop", "restart"),
                ("reset", "stop"), ("start", "reset")]


def ctl_storm(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """``clients`` sparkctl clients at once, each a few commands in a row, on one node or spread over both."""
    nodes = ["head", "worker"] if params["node"] == "both" else [params["node"]]
    results: list[subprocess.CompletedProcess[str]] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        node = nodes[n % len(nodes)]
        for command in STORM_ORDERS[(n + params.get("shift", 0)) % len(STORM_ORDERS)]:
            try:
                done = ctl(pair, node, command, timeout=120)
            except subprocess.TimeoutExpired:
                ledger.add(f"sparkctl {command} on the {node} did not answer within 120 s in a storm")
                continue
            with lock:
                results.append(done)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(params["clients"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for done in results:
        if "Traceback" in done.stderr or "Traceback" in done.stdout:
            ledger.add(f"sparkctl {done.args[-1]} printed a traceback in a storm")
    ctl(pair, "head", "start", timeout=120)  # whatever the storm left: the operator wants the pair running
    return f"{params['clients']} clients on the {params['node']}: " + ", ".join(
        f"{d.args[-1]}={d.returncode}" for d in results)


HOLDER = textwrap.dedent("""\
    import socket, sys, time
    host, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection((host, port), timeout=5))
        except OSError:
            break
    print(len(held), flush=True)
    time.sleep(hold)
    """)


def idle_connections(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    port = int(pair.head.config["api"]["port"])
    holder = subprocess.Popen(["ip", "netns", "exec", pair.link.head_ns, PY, "-c", HOLDER, pair.link.head_addr,
                               str(port), str(params["count"]), str(params["hold_s"])],
                              stdout=subprocess.PIPE, text=True)
    try:
        opened = holder.stdout.readline().strip() if holder.stdout else "?"
        api_latency(pair, "head", ledger, f"{params['count']} idle connections")
        if params.get("kill_rank"):  # a vLLM failure while the descriptors are exhausted (reliability.md 5f)
            vllm_sigkill(pair, {"node": "head"}, ledger)
        holder.wait(params["hold_s"] + 30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout:
            holder.stdout.close()
    return f"{opened} of {params['count']} idle connections held {params['hold_s']} s"


def peer_flood(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """A third host (no peer) holds ``count`` connections to the worker's sparkd, reopening each one it loses, for
    ``hold_s`` (beyond the peer grace): both ranks must be the same processes afterwards (no peer_lost)."""
    before = {node: pair.rank_pid(node) for node in ("head", "worker")}
    intruder = Intruder.create(pair.link.worker_ns)
    try:
        holder = intruder.run(PY, "-c", FLOOD_HOLDER, pair.link.worker_addr, str(pair.worker.config["api"]["port"]),
                              str(params["count"]), str(params["hold_s"]), stdout=subprocess.PIPE)
        out, _ = holder.communicate(timeout=params["hold_s"] + 60)
    finally:
        intruder.destroy()
    after = {node: pair.rank_pid(node) for node in ("head", "worker")}
    if before != after:
        ledger.add(f"a third host's flood of the worker's port replaced a rank: {before} → {after} (peer_lost)")
    return f"a third host held {params['count']} connections for {params['hold_s']} s ({' '.join(out.split())})"


def log_flood(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    raw = pair.head.state_dir / "run" / "vllm.out"
    writer = subprocess.Popen([PY, "-c", FLOOD, str(raw), str(params["seconds"])])
    worst, sizes, begun, rank = 0.0, [], time.monotonic(), pair.rank_pid("head")
    try:
        while writer.poll() is None:
            worst = max(worst, api_latency(pair, "head", ledger, "a log flood"))
            with contextlib.suppress(OSError):
                sizes.append((round(time.monotonic() - begun, 2), raw.stat().st_size >> 20))
            time.sleep(0.2)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(30)
    biggest = max((size for _, size in sizes), default=0)
    if biggest > RAW_LOG_BOUND_MIB:
        ledger.add(f"the raw vLLM log grew past {RAW_LOG_BOUND_MIB} MiB during a flood",
                   f"(s, MiB): {sizes}; the head's rank {rank} → {pair.rank_pid('head')}")
    return f"flood {params['seconds']} s: API worst {worst:.2f} s, raw log max {biggest} MiB"


def state_full(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    filler = pair.head.state_dir / "soak-filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 65536)
    finally:
        os.close(fd)
    try:
        deadline = time.monotonic() + params["hold_s"]
        if params.get("kill_rank"):  # a vLLM failure while nothing can be written (reliability.md 4)
            vllm_sigkill(pair, {"node": "head"}, ledger)
        while time.monotonic() < deadline:
            api_latency(pair, "head", ledger, "a full state filesystem")
            time.sleep(0.5)
    finally:
        filler.unlink(missing_ok=True)
    return f"state filesystem full for {params['hold_s']} s"
