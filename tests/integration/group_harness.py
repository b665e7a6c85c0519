"""A group of N nodes for the tests: N network namespaces on one bridge, a sparkd in each, supervising a
stand-in rank coupled to the others through the master port (``--nnodes N --node-rank i``).

The bridge lives in a namespace of its own, so nothing touches the host's interfaces; a node is cut from the
group by taking its veth down. Everything is named after this process and a counter, and removed at the end.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from daemon_harness import alive, base_config, kill_tree, peer_token, title_prefix, tree, unique_prefix
from pair_harness import NETNS_PREFIX, NodeDaemon, ip

_FABRICS = itertools.count(1)


@dataclass
class Fabric:
    bridge_ns: str
    nodes: list[str]  # namespaces, rank order
    veths: list[str]  # each node's interface, inside its namespace
    addresses: list[str]

    @classmethod
    def create(cls, n: int) -> Fabric:
        tag = f"{os.getpid() % 10000}g{next(_FABRICS)}"
        subnet = f"10.232.{(os.getpid() + n * 7 + int(tag.split('g')[1])) % 250}"
        fabric = cls(f"{NETNS_PREFIX}b{tag}", [f"{NETNS_PREFIX}n{tag}x{i}" for i in range(n)],
                     [f"spn{tag}x{i}" for i in range(n)], [f"{subnet}.{i + 1}" for i in range(n)])
        ip("netns", "add", fabric.bridge_ns)
        ip("link", "add", "br0", "type", "bridge", ns=fabric.bridge_ns)
        ip("link", "set", "br0", "up", ns=fabric.bridge_ns)
        for i, (ns, veth, addr) in enumerate(zip(fabric.nodes, fabric.veths, fabric.addresses, strict=True)):
            outer = f"spb{tag}x{i}"
            ip("netns", "add", ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", outer)
            ip("link", "set", veth, "netns", ns)
            ip("link", "set", outer, "netns", fabric.bridge_ns)
            ip("link", "set", outer, "master", "br0", ns=fabric.bridge_ns)
            ip("link", "set", outer, "up", ns=fabric.bridge_ns)
            ip("addr", "add", f"{addr}/24", "dev", veth, ns=ns)
            ip("link", "set", veth, "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
        return fabric

    def cut(self, i: int) -> None:
        ip("link", "set", self.veths[i], "down", ns=self.nodes[i])

    def restore(self, i: int) -> None:
        ip("link", "set", self.veths[i], "up", ns=self.nodes[i])

    def destroy(self) -> None:
        for ns in (*self.nodes, self.bridge_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def group_configs(tmp: Path, fabric: Fabric, *, tp: int, pp: int = 1, ranks: list[int] | None = None,
                  peer_grace_s: float = 3, **sections: dict[str, Any]) -> list[dict[str, Any]]:
    """One config per node: rank 0 is the head and lists every worker; each worker lists the head."""
    n = len(fabric.nodes)
    token = peer_token(tmp / "token")
    head = fabric.addresses[0]
    configs = []
    for i, addr in enumerate(fabric.addresses):
        role = "head" if i == 0 else "worker"
        folder = tmp / f"node{i}"
        folder.mkdir()
        cfg = base_config(folder, 8000, **sections)
        cfg["node"] = {"name": f"spark{i}", "role": role, "rank": (ranks or list(range(n)))[i], "address": addr}
        cfg["launch"].update({"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "host": "0.0.0.0",
                              "port": 8000, "max_model_len": 8192})
        cfg["launch"]["env"]["VLLM_PROCESS_NAME_PREFIX"] = unique_prefix()
        cfg["cluster"] = {"master_addr": head, "master_port": 29501, "nnodes": n, "peer_poll_s": 0.5,
                          "peer_grace_s": peer_grace_s, "worker_start_timeout_s": 90,
                          "peers": fabric.addresses[1:] if i == 0 else [head]}
        cfg["api"] = {"socket_group": "", "listen": addr, "port": 9479, "token_file": str(token)}
        configs.append(cfg)
    return configs


class Group:
    def __init__(self, tmp: Path, fabric: Fabric, **kw: Any) -> None:
        self.fabric = fabric
        configs = group_configs(tmp, fabric, **kw)
        self.nodes = [NodeDaemon(tmp / f"node{i}", cfg, fabric.nodes[i]) for i, cfg in enumerate(configs)]
        self.seen: list[psutil.Process] = []

    @property
    def head(self) -> NodeDaemon:
        return self.nodes[0]

    @property
    def workers(self) -> list[NodeDaemon]:
        return self.nodes[1:]

    def start(self) -> Group:
        for node in self.workers:
            node.start()
        self.head.start()
        return self

    def ready(self, head_launches: int = 1, timeout: float = 150) -> list[int]:
        """The PIDs of every rank once the head has launched ``head_launches`` times and every rank serves."""

        def current(node: NodeDaemon, s: dict[str, Any]) -> bool:
            return node.proc is not None and s.get("daemon_pid") == node.proc.pid and s.get("state") == "ready"

        self.head.wait_for(lambda s: current(self.head, s) and s.get("launches", 0) >= head_launches, timeout,
                           f"head ready (launch {head_launches})")
        pids = [int(self.head.status()["pid"])]
        for node in self.workers:
            pids.append(int(node.wait_for(lambda s, n=node: current(n, s), timeout, f"{node.ns} ready")["pid"]))
        for pid in pids:
            self.seen.extend(tree(pid))
        return pids

    def one_instance_per_node(self) -> None:
        for node in self.nodes:
            pid = node.status()["pid"]
            prefix = title_prefix(node.config)
            ours = {p.pid for p in tree(pid)}
            titled = {p.pid for p in psutil.process_iter(["cmdline"])
                      if (p.info["cmdline"] or [""])[0].startswith(prefix)}
            assert titled and titled <= ours, f"{node.ns}: {titled - ours} outside the instance {pid}"

    def close(self) -> None:
        for node in self.nodes:
            pid = node.status().get("pid")
            if pid:
                self.seen.extend(tree(pid))
            node.end()
        kill_tree(alive(self.seen))
        self.fabric.destroy()
