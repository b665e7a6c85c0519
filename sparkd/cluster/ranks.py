"""Is this a group vLLM can form? The ranks of every node, checked together before any start. Pure.

Rules, each a sentence naming the nodes and their ranks:

1. Every ``node.rank`` is unique, and together they are exactly ``0 … nnodes − 1``.
2. Every node says the same ``nnodes``, and it is the number of nodes in the group.
3. ``tensor_parallel_size × pipeline_parallel_size`` is the number of GPUs across the nodes
   (``nnodes × gpus_per_node``), and every node says the same sizes.
4. The head is rank 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sparkd.commands.statusdoc import Status
from sparkd.config import Config, Role


def group_role(cfg: Config) -> Role | None:
    """head or worker when this node is one rank of a multi-node group with peers; else None (a single node,
    whose daemon never imports the group's machinery: :mod:`sparkd.cluster.coordinator` and the group checks)."""
    if not cfg.cluster.peers or cfg.nnodes <= 1 or cfg.node.role is Role.single:
        return None
    return cfg.node.role


@dataclass(frozen=True)
class Member:
    node: str
    where: str  # its address, as the head reaches it ("this node" for the head itself)
    rank: int
    nnodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus_per_node: int
    head: bool = False

    @classmethod
    def from_status(cls, status: Status, where: str) -> Member:
        shared = status.get("shared") or {}
        return cls(node=str(status.get("node", where)), where=where, rank=int(status.get("rank", -1)),
                   nnodes=int(shared.get("nnodes") or 1), tensor_parallel_size=int(shared.get("tensor_parallel_size")
                                                                               or 1),
                   pipeline_parallel_size=int(shared.get("pipeline_parallel_size") or 1),
                   gpus_per_node=int(status.get("gpus_per_node") or 1), head=status.get("role") == "head")

    def named(self) -> str:
        return f"{self.node} ({self.where}) rank {self.rank}"


def group_problems(members: list[Member]) -> list[str]:
    problems: list[str] = []
    counts = Counter(m.rank for m in members)
    for rank, n in sorted(counts.items()):
        if n > 1:
            holders = ", ".join(m.named() for m in members if m.rank == rank)
            problems.append(f"rank {rank} is claimed {n} times: {holders}")
    expected = set(range(len(members)))
    missing, stray = sorted(expected - counts.keys()), sorted(counts.keys() - expected)
    if missing or stray:
        listing = ", ".join(m.named() for m in sorted(members, key=lambda m: m.rank))
        problems.append(f"the ranks of {len(members)} nodes must be 0…{len(members) - 1}, but they are: {listing}")
    for m in members:
        if m.nnodes != len(members):
            problems.append(f"nnodes is {m.nnodes} on {m.named()}, but the group has {len(members)} nodes")
    sizes = {(m.tensor_parallel_size, m.pipeline_parallel_size) for m in members}
    if len(sizes) > 1:
        problems.append("the parallel sizes differ: " + ", ".join(
            f"{m.named()} tensor {m.tensor_parallel_size} × pipeline {m.pipeline_parallel_size}" for m in members))
    gpus = sum(m.gpus_per_node for m in members)
    for tp, pp in sorted(sizes):
        if tp * pp != gpus:
            problems.append(f"tensor_parallel_size {tp} × pipeline_parallel_size {pp} = {tp * pp} GPUs, but the "
                            f"{len(members)} nodes have {gpus}")
    heads = [m for m in members if m.head]
    if heads and heads[0].rank != 0:
        problems.append(f"the head must be rank 0: {heads[0].named()}")
    return problems
