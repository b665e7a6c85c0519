"""The flight recorder as the operator reads it (``sparkctl postmortem``, ``sparkctl bundle``, the ``recorder``
command): this node's runs and records, and every peer's through the peer API; and what the status and the
metrics say of a recorder that is off. Its ring's modules are imported when a ring is read, not before: a daemon
with the recorder off never loads them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from sparkd.config import Config, Role
from sparkd.daemon.watch.memory import read_boot_id

if TYPE_CHECKING:  # a postmortem's imports stay light
    from sparkd.cluster.coordinator import Coordinator
    from sparkd.daemon.loop.nodestate import NodeState
    from sparkd.supervisor import vocabulary as v

__all__ = ["FlightRecorder", "RecorderOff", "flight_records", "own_records", "ring_path"]

PEER_RECORDS_TIMEOUT_S = 30.0


def ring_path(cfg: Config) -> Path:
    return cfg.recorder.path or cfg.paths.state_dir / "recorder.ring"


class FlightRecorder(Protocol):
    """The flight recorder as the daemon runs it and the status, the metrics and the restart gate see it."""

    def note(self, text: str) -> None:
        """An event for the next record."""

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """The node changed: a transition is an event for the next record."""

    async def run(self) -> None:
        """Record until cancelled."""

    async def close(self) -> None:
        """The clean exit's record."""

    def problems(self) -> list[str]: ...

    def status(self) -> dict[str, Any]: ...

    def counts(self) -> tuple[int, int, int]:
        """Records written to the ring, records lost, fdatasync calls."""


class RecorderOff:
    """``[recorder] enabled = false``: no ring written, nothing noted; the status says where it would be."""

    def __init__(self, cfg: Config) -> None:
        self.path = ring_path(cfg)
        self.watchdog = cfg.recorder.hardware_watchdog  # never armed without the ring's records

    def note(self, text: str) -> None:
        pass

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        pass

    async def run(self) -> None:
        """Nothing to record: returns at once (no task wakes for it)."""

    async def close(self) -> None:
        pass

    def problems(self) -> list[str]:
        return []

    def status(self) -> dict[str, Any]:
        return {"path": str(self.path), "records": 0, "written": 0, "cpu_s": 0.0, "dropped": 0, "syncs": 0,
                "problem": None, "watchdog": {"armed": False, "pets": 0} if self.watchdog else None}

    def counts(self) -> tuple[int, int, int]:
        return 0, 0, 0


def own_records(cfg: Config, since: float | None, until: float | None) -> dict[str, Any]:
    """This node's runs (and records in ``[since, until]`` when ``until`` is given), for the recorder command."""
    from sparkd.recorder.excerpt import records_between, summaries

    out: dict[str, Any] = {"node": cfg.node.name, "rank": cfg.node_rank if cfg.node.role is not Role.single else None,
                           "role": cfg.node.role.value, "now": time.time(), "interval_s": cfg.recorder.interval_s,
                           "boot": read_boot_id(cfg.recorder.boot_id_path), "runs": [], "records": []}
    path = ring_path(cfg)
    try:
        out["runs"] = [r.to_json() for r in summaries(path, since)]
        if until is not None:
            out["records"] = records_between(path, since if since is not None else 0.0, until)
    except OSError as exc:
        out["error"] = f"cannot read the ring {path}: {exc.strerror or exc}"
    return out


async def flight_records(cfg: Config, group: Coordinator | None, *, since: float | None,
                         until: float | None) -> dict[str, Any]:
    """This node's answer and, with ``group``, every peer's (asked in parallel through the peer API)."""
    own = await anyio.to_thread.run_sync(own_records, cfg, since, until)
    nodes: list[dict[str, Any]] = [own]
    if group is not None:
        from sparkd.cluster.peers import PeerRefused, PeerUnreachable
        from sparkd.commands import recorder

        async def one(peer: str) -> None:
            known = (group.views[peer].status or {}).get("node") if peer in group.views else None
            try:
                answer = await group.client.call(peer, recorder.COMMAND, recorder.Request(since, until, local=True),
                                                 retries=1, timeout_s=PEER_RECORDS_TIMEOUT_S)
                theirs = answer.get("nodes")
                nodes.extend({**n, "peer": peer} for n in (theirs if isinstance(theirs, list) else [])
                             if isinstance(n, dict))
            except (PeerUnreachable, PeerRefused) as exc:
                nodes.append({"node": known or peer, "peer": peer, "error": str(exc), "runs": [], "records": []})

        async with anyio.create_task_group() as tg:
            for peer in group.client.peers:
                tg.start_soon(one, peer)
    return {"reference": own["node"], "nodes": nodes}
