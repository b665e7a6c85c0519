"""One node's side of the fabric check: its fabric link and GID as the kernel shows them now, and — on a worker,
at the head's request — the echoes back to the head and the connect to the master port (``/v1/rank/fabric``): to
the configured peers' addresses and this group's master port only, whatever the request names.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from sparkd.cluster.addresses import PeerAddresses, Resolver, normalise, peer_host, system_resolver
from sparkd.cluster.fabric import SMALL, End
from sparkd.config import Config, Role
from sparkd.launch.render import nccl_ib_in_play
from sparkd.preflight.dfping import Ping, df_ping, tcp_reach
from sparkd.preflight.gid import gid_view
from sparkd.preflight.netdev import fabric_link
from sparkd.preflight.rdma import read_ports

PING_TIMEOUT_S = 1.0


def fabric_address(cfg: Config, env: Mapping[str, str]) -> str | None:
    """This node's address on the fabric: ``[node] address``, ``VLLM_HOST_IP``, or on the head the master's."""
    return cfg.node.address or env.get("VLLM_HOST_IP") or (cfg.master_addr if cfg.node.role is Role.head else None)


def local_end(cfg: Config, sys_root: Path, env: Mapping[str, str]) -> End:
    """This node's fabric link and GID, read now (blocking: sysfs and getifaddrs)."""
    address = fabric_address(cfg, env)
    link, problem = fabric_link(sys_root, cfg.fabric.interface, address)
    gid = None
    if link is not None and link.exists and nccl_ib_in_play(env, cfg.nnodes):
        ports = read_ports(sys_root / "class" / "infiniband")
        if ports:
            gid = gid_view(ports, link.interface, address, env.get("NCCL_IB_GID_INDEX"))
    return End(cfg.node.name, link, problem, gid)


async def echoes(address: str, size: int, timeout_s: float = PING_TIMEOUT_S) -> list[Ping]:
    """A small don't-fragment echo and one of ``size`` bytes to ``address``, side by side; none to an IPv6 address
    (its path never fragments in transit: the interfaces' MTUs are what counts, and they are compared)."""
    if ":" in address:
        return []
    results: dict[int, Ping] = {}

    async def one(n: int) -> None:
        results[n] = await anyio.to_thread.run_sync(df_ping, address, n, timeout_s)

    async with anyio.create_task_group() as tg:
        for n in (SMALL, size):
            tg.start_soon(one, n)
    return [results[SMALL], results[size]]


def configured_targets(cfg: Config, resolve: Resolver = system_resolver) -> set[str]:
    """The addresses this node may ping for a peer: its configured peers' and the rendezvous host (the head's
    fabric address), resolved (blocking)."""
    hosts = {peer_host(p) for p in cfg.cluster.peers} | ({cfg.master_addr} if cfg.master_addr else set())
    return set(PeerAddresses(sorted(hosts), resolve).addresses)


def unasked(cfg: Config, address: str | None, master: tuple[str, int] | None,
            targets: set[str]) -> tuple[str | None, tuple[str, int] | None, list[str]]:
    """(the ping target, the master to connect to, the refusals): a request may name only a configured peer's
    address and this group's own ``master_addr:master_port`` (review 2, #35: a signed peer made the head ping and
    TCP-connect to any host and port)."""
    refused: list[str] = []
    if address is not None and normalise(address) not in targets:
        refused.append(f"{address} is not a configured peer's address ([cluster] peers, master_addr): not pinged")
        address = None
    own = (normalise(cfg.master_addr), cfg.master_port) if cfg.master_addr else None
    if master is not None and (normalise(master[0]), master[1]) != own:
        refused.append(f"{master[0]}:{master[1]} is not this group's master_addr:master_port: not connected to")
        master = None
    return address, master, refused


async def answer(cfg: Config, sys_root: Path, env: Mapping[str, str], *, address: str | None, size: int,
                 master: tuple[str, int] | None, timeout_s: float = PING_TIMEOUT_S) -> dict[str, Any]:
    """The worker's answer to the head: its end, its echoes to the head's ``address`` at ``size`` bytes, its
    connect to ``master`` (host, port) when asked — each only where the config names it."""
    end = await anyio.to_thread.run_sync(local_end, cfg, sys_root, env)
    targets = await anyio.to_thread.run_sync(configured_targets, cfg)
    address, master, refused = unasked(cfg, address, master, targets)
    out: dict[str, Any] = {"end": end.to_json(), "pings": [], "master": None}
    if refused:
        out["refused"] = refused
    timeout = min(timeout_s, PING_TIMEOUT_S)

    async def ping() -> None:
        if address and end.link is not None and end.link.up:
            out["pings"] = [p.to_json() for p in await echoes(address, size, timeout)]

    async def connect() -> None:
        if master is not None:
            out["master"] = await anyio.to_thread.run_sync(tcp_reach, master[0], master[1], timeout)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ping)
        tg.start_soon(connect)
    return out
