"""The RoCE GID NCCL will use on the fabric interface, re-resolved from sysfs at every start. Pure.

NCCL is told an index (``NCCL_IB_GID_INDEX``); the GID table behind it is rebuilt by the kernel whenever an
address comes or goes, so after a reboot or a re-addressing the index can point at an empty slot, at the
link-local ``fe80::`` GID (which no peer routes to) or at a RoCE v1 one. The index that works is the RoCE v2 GID
holding the fabric address as an IPv4-mapped address (:func:`sparkd.preflight.rdma.roce_v2_index`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sparkd.preflight.rdma import ROCE_V2, Port, index_problem, ipv4_of, roce_v2_index


@dataclass(frozen=True)
class GidView:
    """The GID facts of one node's fabric interface, for the group's check and status."""

    port: str | None = None  # "rocep1s0f0 port 1": the RDMA port backing the fabric interface
    index: int | None = None  # the RoCE v2 GID index of the fabric address: the one that works
    configured: str | None = None  # NCCL_IB_GID_INDEX as NCCL will be told
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> GidView | None:
        if not isinstance(data, dict):
            return None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def backing_port(ports: Sequence[Port], interface: str, address: str | None) -> Port | None:
    """The RDMA port whose GIDs belong to ``interface`` (``gid_attrs/ndevs``), else the one holding ``address``."""
    for port in ports:
        if any(g.ndev == interface for g in port.gids):
            return port
    for port in ports:
        if address and any(g.type == ROCE_V2 and ipv4_of(g.gid) == address for g in port.gids):
            return port
    return None


def gid_view(ports: Sequence[Port], interface: str, address: str | None, configured: str | None) -> GidView:
    port = backing_port(ports, interface, address)
    if port is None:
        return GidView(configured=configured)  # no RDMA device behind the interface: NCCL uses sockets here
    index = roce_v2_index(port, address)
    if index is None:
        return GidView(port.name, None, configured, f"{port.name} (behind {interface}) has no RoCE v2 GID with an "
                       "IPv4 address: is the interface up and addressed?")
    problem = index_problem(port, configured, address) if configured is not None else None
    return GidView(port.name, index, configured, problem)
