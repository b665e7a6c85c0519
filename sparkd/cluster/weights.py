"""Weights parity: every node's manifest of the model directory compared with the head's before a start.

Rules (:func:`compare`, pure):

1. A file on one node and not on the other differs; so does a size.
2. Where both nodes hashed a file, the sha256 decides; where one has no hash yet (a changed shard the start had
   no time for), the file is compared by size, and the report says so.
3. mtimes are not compared across nodes (a copy need not keep them): they only decide, on each node, whether a
   shard must be hashed again.

A difference refuses the start with ``config_error`` (``Cause.weights``), naming the files and the node; the
head asks each worker's sparkd for its manifest (``POST /v1/rank/weights``) beside its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.cluster.peers import PeerClient, PeerRefused, PeerUnreachable
from sparkd.commands.groupcheck import RANK_WEIGHTS, WeightsRequest
from sparkd.config import Config
from sparkd.preflight.manifest import Manifest
from sparkd.supervisor.failures import CAUSES, Cause, Failure, FailureClass

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

SHOWN = 5
FULL_TIMEOUT_S = 24 * 3600.0  # a worker re-reading every shard (sparkctl weights --full)


@dataclass
class Comparison:
    node: str
    differ: list[str] = field(default_factory=list)  # one phrase per file that differs
    by_size: list[str] = field(default_factory=list)  # files compared by size only (a hash is pending)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "differ": self.differ, "by_size": self.by_size}


def _short(digest: str) -> str:
    return digest[:12] + "…"


def compare(head: Manifest, other: Manifest, node: str) -> Comparison:
    out = Comparison(node)
    for rel in sorted(head.files.keys() | other.files.keys()):
        mine, theirs = head.files.get(rel), other.files.get(rel)
        if theirs is None:
            out.differ.append(f"{rel} is missing on {node}")
        elif mine is None:
            out.differ.append(f"{rel} is on {node} but not on the head")
        elif mine.size != theirs.size:
            out.differ.append(f"{rel} is {mine.size} bytes on the head but {theirs.size} on {node}")
        elif mine.sha256 and theirs.sha256:
            if mine.sha256 != theirs.sha256:
                out.differ.append(f"{rel} has sha256 {_short(mine.sha256)} on the head but "
                                  f"{_short(theirs.sha256)} on {node}")
        else:
            out.by_size.append(rel)
    return out


def refusal(problems: list[str], comparisons: list[Comparison]) -> Failure | None:
    """The start's refusal: every node whose directory cannot be read, every file that differs (the first few)."""
    phrases = list(problems)
    for c in comparisons:
        if c.differ:
            shown = "; ".join(c.differ[:SHOWN]) + (f"; and {len(c.differ) - SHOWN} more" if len(c.differ) > SHOWN
                                                    else "")
            phrases.append(f"{len(c.differ)} file(s) differ on {c.node}: {shown}")
    if not phrases:
        return None
    return Failure.of(CAUSES[Cause.weights][0], "The model directory is not the same on every node: "
                      f"{'; '.join(phrases)}; copy the head's files to it (rsync -a) or fix the head's — sparkd "
                      "will not start a group whose weights differ.")


Local = Callable[..., Awaitable[Manifest]]


class Parity:
    """The head's comparison, and what it found for status, ``sparkctl weights`` and metrics."""

    def __init__(self, config: Callable[[], Config], client: PeerClient, local: Local, log: Logger) -> None:
        self.config = config  # the config in force, read at every comparison
        self.client = client
        self.local = local
        self.log = log
        self.report: dict[str, Any] | None = None

    @property
    def cfg(self) -> Config:
        """The config in force (a reload is read from the next use on)."""
        return self.config()

    async def run(self, *, full: bool = False) -> Failure | None:
        if not self.cfg.weights.parity:
            return None
        manifests: dict[str, Manifest] = {}
        failures: list[Failure] = []

        async def mine() -> None:
            manifests[self.cfg.node.name] = await self.local(full=full)

        async def theirs(peer: str) -> None:
            try:
                reply = await self.client.call(peer, RANK_WEIGHTS, WeightsRequest(full),
                                               timeout_s=FULL_TIMEOUT_S if full else self._timeout(), retries=0)
            except PeerUnreachable as exc:
                failures.append(Failure.of(FailureClass.peer_lost, f"The worker's sparkd at {peer} cannot be "
                                           f"reached ({exc}); the head waits for it with backoff."))
                return
            except PeerRefused as exc:  # an older sparkd: the weights stay unchecked there, said in the report
                self.log.warning("weights_not_checked", peer=peer, error=str(exc))
                return
            manifest = Manifest.from_json(reply.get("manifest"))
            if manifest is not None:
                manifests[str(reply.get("node") or peer)] = manifest

        async with anyio.create_task_group() as tg:
            tg.start_soon(mine)
            for peer in self.client.peers:
                tg.start_soon(theirs, peer)
        return failures[0] if failures else self._judge(manifests)

    def _timeout(self) -> float:
        return self.cfg.weights.hash_budget_s + 30.0 + self.cfg.cluster.peer_timeout_s

    def _judge(self, manifests: dict[str, Manifest]) -> Failure | None:
        head = manifests.get(self.cfg.node.name)
        if head is not None and head.skipped:
            self.report = {"ok": None, "skipped": head.skipped, "nodes": {}, "comparisons": []}
            return None
        problems = [f"on {node}: {m.problem or 'not compared: ' + str(m.skipped)}" for node, m in manifests.items()
                    if m.problem or m.skipped]
        comparisons = [] if head is None or head.problem else [
            compare(head, m, node) for node, m in manifests.items()
            if node != self.cfg.node.name and not m.problem and not m.skipped]
        self.report = {
            "nodes": {node: {"root": m.root, "files": len(m.files), "hashed": len(m.hashed),
                             "pending": len(m.pending), "duration_s": round(m.duration_s, 3), "problem": m.problem}
                      for node, m in manifests.items()},
            "comparisons": [c.to_json() for c in comparisons],
        }
        failure = refusal(problems, comparisons)
        by_size = sum(len(c.by_size) for c in comparisons)
        if failure is None and by_size:
            self.log.warning("weights_compared_by_size", files=by_size, why="a changed shard is not hashed yet")
        self.report["ok"] = failure is None
        return failure
