"""The failure evidence as this node's effects use it: with the memory guard's facts (its memory sample, its kernel
lines since the launch) and the last preflight's results. The evidence writer is built before the guard (whose
hooks write through it); this is built after it, so nobody hands the guard around."""

from __future__ import annotations

from typing import Any

from sparkd.daemon.effects.evidence import Counters, FailureEvidence
from sparkd.daemon.effects.preflighting import LocalPreflight
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.guard.guard import Guard
from sparkd.supervisor.failures import Failure, FailureClass


class NodeEvidence:
    def __init__(self, evidence: FailureEvidence, guard: Guard | None, preflight: LocalPreflight) -> None:
        self.evidence = evidence
        self.guard = guard
        self.preflight = preflight

    @property
    def counters(self) -> Counters:
        return self.evidence.counters

    def mark_launch(self) -> None:
        """A launch begins: the kernel lines from now on belong to it."""
        self.evidence.mark_launch(self.guard)

    async def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                            engine_gone: bool, state: NodeState) -> Failure:
        """The watch's death, classified with every fact sparkd has (the guard's memory and kernel lines)."""
        return await self.evidence.classify_exit(exit_code, sig, hint, engine_gone, guard=self.guard, state=state)

    async def record(self, failure: Failure, written: bool, state: NodeState) -> None:
        """Count the failure and keep its evidence (unless the guard wrote it already)."""
        await self.evidence.record(failure, written=written, state=state, preflight=self.preflight.last,
                                   guard=self.guard)

    async def note_stop(self, failure: Failure, stop: dict[str, Any]) -> None:
        """The stop that answered ``failure``, into its incident."""
        await self.evidence.note_stop(failure, stop)
