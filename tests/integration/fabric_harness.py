"""Two nodes with two links each, as a DGX Spark pair is cabled: a management link the daemons talk over (the peer
API) and a fabric link the ranks use (node address, master port). Each node is a network namespace of the test's
own (``n30-…``), joined by two veth pairs; the test sets the fabric's MTU on either end, takes either end down,
and makes a node drop don't-fragment echoes above 1500 bytes (iptables inside its namespace). ``destroy`` deletes
the namespaces and with them the veths and the rules.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pair_harness import NodeDaemon, ip, pair_configs

_WIRES = itertools.count(1)
SIDES = ("head", "worker")


@dataclass
class Wires:
    tag: str
    ns: dict[str, str]
    mgmt: dict[str, str]  # side -> management address
    fabric: dict[str, str]  # side -> fabric address
    fabric_if: dict[str, str]  # side -> fabric interface (inside the side's namespace)

    @classmethod
    def create(cls) -> Wires:
        n = next(_WIRES)
        tag = f"{os.getpid() % 10000}x{n}"
        net = (os.getpid() + n) % 250
        wires = cls(tag, {s: f"n30-{s[0]}{tag}" for s in SIDES}, {s: f"10.236.{net}.{i + 1}" for i, s in
                                                                   enumerate(SIDES)},
                    {s: f"10.237.{net}.{i + 1}" for i, s in enumerate(SIDES)}, {s: f"n30f{tag}{s[0]}" for s in SIDES})
        try:
            for side in SIDES:
                ip("netns", "add", wires.ns[side])
                ip("link", "set", "lo", "up", ns=wires.ns[side])
            for kind, addrs in (("m", wires.mgmt), ("f", wires.fabric)):
                names = {s: f"n30{kind}{tag}{s[0]}" for s in SIDES}
                ip("link", "add", names["head"], "type", "veth", "peer", "name", names["worker"])
                for side in SIDES:
                    ip("link", "set", names[side], "netns", wires.ns[side])
                    ip("addr", "add", f"{addrs[side]}/24", "dev", names[side], ns=wires.ns[side])
                    ip("link", "set", names[side], "up", ns=wires.ns[side])
        except subprocess.CalledProcessError:
            wires.destroy()
            raise
        return wires

    def mtu(self, side: str, value: int) -> None:
        ip("link", "set", self.fabric_if[side], "mtu", str(value), ns=self.ns[side])

    def link(self, side: str, state: str) -> None:
        ip("link", "set", self.fabric_if[side], state, ns=self.ns[side])

    def drop_big_echoes(self, side: str) -> None:
        """The node drops echo requests over 1500 bytes (a switch port or firewall that eats jumbo frames)."""
        subprocess.run(["ip", "netns", "exec", self.ns[side], "iptables", "-A", "INPUT", "-p", "icmp",
                        "--icmp-type", "echo-request", "-m", "length", "--length", "1501:65535", "-j", "DROP"],
                       check=True, capture_output=True, timeout=30)

    def destroy(self) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@dataclass
class _Mgmt:
    head_addr: str
    worker_addr: str


class FabricPair:
    """A head and a worker daemon on :class:`Wires`: the peer API on the management link, the ranks on the fabric."""

    def __init__(self, tmp: Path, wires: Wires, sides: dict[str, dict[str, Any]] | None = None,
                 **sections: dict[str, Any]) -> None:
        """``sides``: sections of one side's config only (``{"worker": {"weights": {...}}}``)."""
        self.wires = wires
        mgmt = _Mgmt(wires.mgmt["head"], wires.mgmt["worker"])
        configs = pair_configs(tmp, mgmt, **sections)  # type: ignore[arg-type]
        self.daemons: dict[str, NodeDaemon] = {}
        for side, cfg in zip(SIDES, configs, strict=True):
            cfg["node"]["address"] = wires.fabric[side]
            cfg["cluster"]["master_addr"] = wires.fabric["head"]
            cfg.update((sides or {}).get(side, {}))
            self.daemons[side] = NodeDaemon(tmp / side, cfg, wires.ns[side])

    @property
    def head(self) -> NodeDaemon:
        return self.daemons["head"]

    @property
    def worker(self) -> NodeDaemon:
        return self.daemons["worker"]

    def start(self, env: dict[str, str] | None = None) -> FabricPair:
        self.worker.start(env=env)
        self.head.start(env=env)
        return self

    def close(self) -> None:
        for daemon in self.daemons.values():
            daemon.end()
        self.wires.destroy()


@dataclass
class Routed:
    """A path with a hop of a smaller MTU: ``a`` (MTU 9000) — ``router`` — ``b`` on a 1500 link. Without
    don't-fragment the router fragments a 9000-byte echo and the echo passes; with it the router answers
    "fragmentation needed" (MTU 1500)."""

    ns: dict[str, str]
    b_addr: str

    @classmethod
    def create(cls) -> Routed:
        tag = f"{os.getpid() % 10000}x{next(_WIRES)}"
        net = (os.getpid() + 7) % 250
        routed = cls({k: f"n30-{k}{tag}" for k in ("a", "r", "b")}, f"10.239.{net}.2")
        try:
            for ns in routed.ns.values():
                ip("netns", "add", ns)
                ip("link", "set", "lo", "up", ns=ns)
            for (left, right), (subnet, mtu) in zip((("a", "r"), ("r", "b")), ((f"10.238.{net}", "9000"),
                                                                            (f"10.239.{net}", "1500")), strict=True):
                names = {left: f"n30{left}{tag}{right}", right: f"n30{right}{tag}{left}"}
                ip("link", "add", names[left], "type", "veth", "peer", "name", names[right])
                for host, octet in ((left, "1" if left == "r" else "2"), (right, "1" if right == "r" else "2")):
                    ip("link", "set", names[host], "netns", routed.ns[host])
                    ip("addr", "add", f"{subnet}.{octet}/24", "dev", names[host], ns=routed.ns[host])
                    ip("link", "set", names[host], "mtu", mtu, "up", ns=routed.ns[host])
            subprocess.run(["ip", "netns", "exec", routed.ns["r"], "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                           check=True, capture_output=True, timeout=30)
            ip("route", "add", "default", "via", f"10.238.{net}.1", ns=routed.ns["a"])
            ip("route", "add", "default", "via", f"10.239.{net}.1", ns=routed.ns["b"])
        except subprocess.CalledProcessError:
            routed.destroy()
            raise
        return routed

    def destroy(self) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
