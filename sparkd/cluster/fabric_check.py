"""The head's fabric check before every start of a group: for each worker in parallel, both ends' links, the
echoes each way at the MTU, the GIDs and the master port; bounded by ``[fabric] timeout_s``.

The head opens a listener on the master port for the check (vLLM is stopped then; when the port is taken the
connect is not judged here: the ports check names its holder), asks the worker's sparkd for its end, its echoes
back and its connect (``POST /v1/rank/fabric``), then sends its own echoes to the worker's fabric address. What
was measured is kept for status and metrics (:attr:`FabricCheck.report`); the decisions are
:mod:`sparkd.cluster.fabric`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.cluster import fabric
from sparkd.cluster.bandwidth import Bandwidth
from sparkd.cluster.fabric import End, Expect, Finding, Probes, ping_size
from sparkd.cluster.fabric_probe import PING_TIMEOUT_S, echoes, fabric_address, local_end
from sparkd.cluster.peers import PeerClient, PeerRefused, PeerUnreachable
from sparkd.cluster.reach import worker_unreachable
from sparkd.commands.groupcheck import RANK_FABRIC, FabricRequest
from sparkd.config import Config
from sparkd.preflight.dfping import Ping, listen_once
from sparkd.supervisor.failures import Failure, FailureClass

if TYPE_CHECKING:
    from sparkd.host.logs import Logger


def link_json(end: End) -> dict[str, Any]:
    link = end.link
    return {"node": end.node, "interface": link.interface if link else None, "state": link.state if link else None,
            "mtu": link.mtu if link else None, "speed_mbps": link.speed_mbps if link else None,
            "address": link.address if link else None,
            "gid_index": end.gid.index if end.gid else None, "gid_port": end.gid.port if end.gid else None}


def _pings(pings: list[Ping]) -> list[dict[str, Any]]:
    return [{"size": p.size, "ok": p.ok, "rtt_ms": p.rtt_ms, "error": p.error, "method": p.method} for p in pings]


class FabricCheck:
    def __init__(self, config: Callable[[], Config], client: PeerClient, *, env: Callable[[], Mapping[str, str]],
                 log: Logger, sys_root: Path = Path("/sys"), bandwidth: Bandwidth | None = None) -> None:
        self.config = config  # the config in force, read at every check
        self.client = client
        self.env = env
        self.log = log
        self.sys_root = sys_root
        self.bandwidth = bandwidth
        self.report: dict[str, dict[str, Any]] = {}  # peer -> what the last check measured

    @property
    def cfg(self) -> Config:
        """The config in force (a reload is read from the next use on)."""
        return self.config()

    async def run(self) -> Failure | None:
        """None when every worker's link holds; else the refusal (the first failing peer's)."""
        if not self.cfg.fabric.check:
            return None
        env = self.env()
        head = await anyio.to_thread.run_sync(local_end, self.cfg, self.sys_root, env)
        size = ping_size(head, Expect(self.cfg.fabric.mtu, self.cfg.fabric.min_speed_mbps))
        host = self.cfg.master_addr or fabric_address(self.cfg, env)
        master = (host, self.cfg.master_port) if host else None
        listener = listen_once(*master) if master else None
        failures: dict[str, Failure] = {}
        try:
            with anyio.move_on_after(self.cfg.fabric.timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    for peer in self.client.peers:
                        tg.start_soon(self._one, peer, head, size, master if listener else None, failures)
        finally:
            if listener is not None:
                listener.close()
        if scope.cancelled_caught:  # a worker's sparkd that does not answer in time: the peer is lost
            for peer in (p for p in self.client.peers if p not in self.report):
                why = f"no answer to the fabric check within {self.cfg.fabric.timeout_s:g} s"
                failures[peer] = worker_unreachable(peer, why)
        for peer in self.client.peers:
            if peer in failures:
                return failures[peer]
        return await self._bandwidth()

    async def _one(self, peer: str, head: End, size: int, master: tuple[str, int] | None,
                   failures: dict[str, Failure]) -> None:
        started = time.monotonic()
        request = FabricRequest(head.link.address if head.link else None, size, master, timeout_s=1.0)
        # The worker's answer must leave time for the head's own echoes within the bound.
        asking = max(self.cfg.fabric.timeout_s - PING_TIMEOUT_S - 0.5, 1.0)
        try:
            reply = await self.client.call(peer, RANK_FABRIC, request, timeout_s=asking, retries=0)
        except PeerUnreachable as exc:
            failures[peer] = worker_unreachable(peer, str(exc))
            self.report[peer] = {"peer": peer, "ok": False, "error": str(exc)}
            return
        except PeerRefused as exc:  # a worker's sparkd without the check (an older version): say so, go on
            self.log.warning("fabric_not_checked", peer=peer, error=str(exc))
            self.report[peer] = {"peer": peer, "ok": None, "error": f"not checked: {exc}"}
            return
        worker = End.from_json(reply.get("end"), peer)
        why = fabric.unchecked([head, worker])
        if why is not None:
            self.log.warning("fabric_not_checked", peer=peer, why=why)
            self.report[peer] = {"peer": peer, "ok": None, "error": f"not checked: {why}"}
            return
        back = [p for p in map(Ping.from_json, reply.get("pings") or []) if p is not None]
        address = worker.link.address if worker.link else None
        out = await echoes(address, size) if address and head.link and head.link.up else []
        probes = Probes(out, back, reply.get("master") if master else None, f"{master[0]}:{master[1]}" if master
                        else "")
        found = fabric.findings([head, worker], probes, Expect(self.cfg.fabric.mtu, self.cfg.fabric.min_speed_mbps))
        self._record(peer, head, worker, probes, found, time.monotonic() - started)
        failure = fabric.failure(peer, found)
        if failure is not None:
            failures[peer] = failure

    def _record(self, peer: str, head: End, worker: End, probes: Probes, found: list[Finding],
                duration_s: float) -> None:
        self.report[peer] = {
            "peer": peer, "ok": not found, "at": time.time(), "duration_s": round(duration_s, 3),
            "head": link_json(head), "worker": link_json(worker),
            "echoes": {"out": _pings(list(probes.out)), "back": _pings(list(probes.back))},
            "master": probes.master, "findings": [{"cause": f.cause.value, "sentence": f.sentence} for f in found],
            "bandwidth_gbps": None,
        }
        self.log.info("fabric_checked", peer=peer, ok=not found, duration_s=round(duration_s, 3),
                      findings=[f.sentence for f in found])

    async def _bandwidth(self) -> Failure | None:
        if self.bandwidth is None or not self.cfg.fabric.bandwidth:
            return None
        for peer in self.client.peers:  # one after another: the figures must not share the head's link
            entry = self.report.get(peer, {})
            head, worker = entry.get("head") or {}, entry.get("worker") or {}
            if not worker.get("address"):
                continue
            gbps, note = await self.bandwidth.measure(peer, worker["address"], head.get("gid_port"),
                                                      head.get("gid_index"))
            entry.update(bandwidth_gbps=gbps, bandwidth_note=note)
            floor = self.cfg.fabric.min_bandwidth_gbps
            if gbps is not None and floor is not None and gbps < floor:
                return Failure.of(FailureClass.config_error, f"The fabric to the worker on {peer} carries "
                                  f"{gbps:.1f} Gb/s (ib_write_bw), below [fabric] min_bandwidth_gbps = {floor:g}; "
                                  "check the link rate and the cable — sparkd will not start the group until it holds.")
        return None
