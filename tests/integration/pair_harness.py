"""Two nodes on one machine: network namespaces joined by a veth pair, a sparkd daemon in each.

Each namespace is a test host of our own (addresses 10.231.N.1 and .2 exist only inside them). Daemons and
their stand-in ranks run inside with ``ip netns exec``; the test reads their status files and talks to their
unix sockets from outside (the file system is shared), and can cut the link with ``ip link set ... down``.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from daemon_harness import BIN, Sparkd, alive, base_config, kill_tree, peer_token, title_prefix, tree, unique_prefix

from sparkd.host.stepfiles import read_steps
from sparkd.vllm_probe.sparkd_vllm_probe.layout import StepRecord

_NETS = itertools.count(1)
# Namespaces are named after this prefix (a session sharing the host with others may set its own).
NETNS_PREFIX = os.environ.get("SPARKD_TEST_NETNS_PREFIX", "sparkd-")


def ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@dataclass
class Link:
    head_ns: str
    worker_ns: str
    head_addr: str
    worker_addr: str
    head_veth: str

    @classmethod
    def create(cls) -> Link:
        n = next(_NETS)
        tag = f"{os.getpid() % 10000}x{n}"
        head_ns, worker_ns = f"{NETNS_PREFIX}h{tag}", f"{NETNS_PREFIX}w{tag}"
        head_veth, worker_veth = f"sph{tag}", f"spw{tag}"
        subnet = f"10.231.{(os.getpid() + n) % 250}"
        ip("netns", "add", head_ns)
        ip("netns", "add", worker_ns)
        ip("link", "add", head_veth, "type", "veth", "peer", "name", worker_veth)
        ip("link", "set", head_veth, "netns", head_ns)
        ip("link", "set", worker_veth, "netns", worker_ns)
        for ns, veth, addr in ((head_ns, head_veth, f"{subnet}.1"), (worker_ns, worker_veth, f"{subnet}.2")):
            ip("addr", "add", f"{addr}/24", "dev", veth, ns=ns)
            ip("link", "set", veth, "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
        return cls(head_ns, worker_ns, f"{subnet}.1", f"{subnet}.2", head_veth)

    def cut(self) -> None:
        ip("link", "set", self.head_veth, "down", ns=self.head_ns)

    def restore(self) -> None:
        ip("link", "set", self.head_veth, "up", ns=self.head_ns)

    def destroy(self) -> None:
        for ns in (self.head_ns, self.worker_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@dataclass
class Intruder:
    """A third host on the fabric, not a peer: a namespace of its own joined by a veth to one node's namespace
    (10.233.N.2, routed through that node), so it reaches that node's sparkd as the review's attacker did."""

    ns: str
    addr: str

    @classmethod
    def create(cls, into_ns: str, *, routed_to: tuple[str, str] | None = None) -> Intruder:
        """``routed_to``: (namespace, gateway address) of another node the intruder may reach through ``into_ns``
        (which then forwards, and that node routes its answers back through the gateway)."""
        n = next(_NETS)
        tag = f"{os.getpid() % 10000}x{n}"
        ns, outer, inner = f"{NETNS_PREFIX}i{tag}", f"spi{tag}", f"spj{tag}"
        subnet = f"10.233.{(os.getpid() + n) % 250}"
        ip("netns", "add", ns)
        try:
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            ip("link", "set", outer, "netns", ns)
            ip("link", "set", inner, "netns", into_ns)
            ip("addr", "add", f"{subnet}.2/24", "dev", outer, ns=ns)
            ip("addr", "add", f"{subnet}.1/24", "dev", inner, ns=into_ns)
            for where, dev in ((ns, outer), (into_ns, inner), (ns, "lo")):
                ip("link", "set", dev, "up", ns=where)
            ip("route", "add", "default", "via", f"{subnet}.1", ns=ns)
            if routed_to is not None:
                subprocess.run(["ip", "netns", "exec", into_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                               check=True, capture_output=True, timeout=30)
                ip("route", "add", f"{subnet}.0/24", "via", routed_to[1], ns=routed_to[0])
        except BaseException:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            raise
        return cls(ns, f"{subnet}.2")

    def run(self, *argv: str, **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], text=True, **kw)

    def destroy(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)


# Holds COUNT connections to HOST:PORT for SECONDS, sending nothing, opening a new one for each the server closes
# (the review's hold.py); prints how many it held at the end and how many it had to reopen.
FLOOD_HOLDER = """\
import selectors, socket, sys, time
host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
sel, reopened, end = selectors.DefaultSelector(), 0, time.monotonic() + seconds
def one():
    try:
        sock = socket.create_connection((host, port), timeout=2)
    except OSError:
        return False
    sock.setblocking(False)
    sel.register(sock, selectors.EVENT_READ)
    return True
for _ in range(count):
    one()
print("opened", len(sel.get_map()), flush=True)
while time.monotonic() < end:
    for key, _ in sel.select(timeout=0.2):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(key.fileobj)
            key.fileobj.close()
    while len(sel.get_map()) < count and time.monotonic() < end:
        if not one():
            break
        reopened += 1
print("held", len(sel.get_map()), "reopened", reopened, flush=True)
"""


class NodeDaemon(Sparkd):
    """A sparkd whose process runs inside a network namespace."""

    def __init__(self, tmp: Path, config: dict[str, Any], ns: str) -> None:
        super().__init__(tmp, config)
        self.ns = ns

    def start(self, *extra: str, env: dict[str, str] | None = None) -> NodeDaemon:
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(env or {})}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, str(BIN / "sparkd"), "run", "--config", str(self.config_path),
                 *extra], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self


def pair_configs(tmp: Path, link: Link, *, worker_launch: dict[str, Any] | None = None,
                 **sections: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    token = peer_token(tmp / "token")
    cluster_over = sections.pop("cluster", {})  # over the pair's own [cluster] below
    common_launch = {"tensor_parallel_size": 2, "host": "0.0.0.0", "port": 8000, "max_model_len": 8192}
    cluster = {"master_addr": link.head_addr, "master_port": 29501, "nnodes": 2, "peer_poll_s": 0.5,
               "peer_grace_s": 3, "worker_start_timeout_s": 60}
    configs = []
    for role, addr, peer, launch_extra in (("head", link.head_addr, link.worker_addr, {}),
                                           ("worker", link.worker_addr, link.head_addr, worker_launch or {})):
        folder = tmp / role
        folder.mkdir()
        cfg = base_config(folder, 8000, **sections)
        cfg["node"] = {"name": role, "role": role, "rank": 0 if role == "head" else 1, "address": addr}
        cfg["launch"].update(common_launch | launch_extra)
        cfg["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"] = unique_prefix()
        cfg["cluster"] = {**cluster, **cluster_over, "peers": [peer]}
        cfg["api"] = {"socket_group": "", "listen": addr, "port": 9479, "token_file": str(token)}
        configs.append(cfg)
    return configs[0], configs[1]


def stop_a_rank(head: Sparkd, worker: Sparkd, rank_pid: int) -> tuple[StepRecord, dict[str, Any], float,
                                                                       list[psutil.Process]]:
    """SIGSTOP every process of a worker's rank and wait for the head's verdict: (the rank's step record, the head's
    failure, seconds from the stop to the verdict, the stopped processes)."""
    record = next(r for r in read_steps(Path(worker.config["paths"]["run_dir"]) / "probe").records
                  if r.role == "worker")
    frozen = tree(rank_pid)
    stopped = time.time()
    for proc in frozen:
        proc.send_signal(signal.SIGSTOP)
    failure = head.wait_for(lambda s: (s.get("last_failure") or {}).get("at", 0) > stopped, 60,
                            "the head names the stopped rank")["last_failure"]
    took = failure["at"] - stopped
    print(f"\nnamed {took:.1f} s after the SIGSTOP: {failure['message']}")
    return record, failure, took, frozen


def launch_time(status: dict[str, Any], launches: int = 1) -> float:
    """Wall time the n-th launch of this run entered `starting` (from the daemon's history)."""
    starts = [h["at"] for h in status.get("history", []) if h.get("state") == "starting" and "phase" not in h]
    return starts[launches - 1] if len(starts) >= launches else float("inf")


class Pair:
    def __init__(self, tmp: Path, link: Link, **kw: Any) -> None:
        self.link = link
        head_cfg, worker_cfg = pair_configs(tmp, link, **kw)
        self.head = NodeDaemon(tmp / "head", head_cfg, link.head_ns)
        self.worker = NodeDaemon(tmp / "worker", worker_cfg, link.worker_ns)
        self.seen: list[psutil.Process] = []

    def start(self) -> Pair:
        self.worker.start()
        self.head.start()
        return self

    def ready(self, head_launches: int = 1, timeout: float = 90) -> tuple[int, int]:
        def current(daemon: NodeDaemon, s: dict[str, Any]) -> bool:
            return daemon.proc is not None and s.get("daemon_pid") == daemon.proc.pid and s.get("state") == "ready"

        head = self.head.wait_for(lambda s: current(self.head, s) and s.get("launches", 0) >= head_launches,
                                  timeout, f"head ready (launch {head_launches})")
        worker = self.worker.wait_for(lambda s: current(self.worker, s), timeout, "worker ready")
        for pid in (head["pid"], worker["pid"]):
            self.seen.extend(tree(pid))
        return int(head["pid"]), int(worker["pid"])

    def one_instance_per_node(self) -> None:
        for daemon in (self.head, self.worker):
            pid = daemon.status()["pid"]
            prefix = title_prefix(daemon.config)
            ours = {p.pid for p in tree(pid)}
            titled = {p.pid for p in psutil.process_iter(["cmdline"])
                      if (p.info["cmdline"] or [""])[0].startswith(prefix)}
            assert titled and titled <= ours, f"{daemon.ns}: {titled - ours} outside the instance {pid}"

    def close(self) -> None:
        for daemon in (self.head, self.worker):
            pid = daemon.status().get("pid")
            if pid:
                self.seen.extend(tree(pid))
            daemon.end()
        kill_tree(alive(self.seen))
        self.link.destroy()
