"""Before every launch: the gates (an earlier stop's GPU memory still held, the memory settle and the restart
gate, the guard's start gate), this node's checks and, on a group's head, the workers' (in parallel with the
fabric and weights proofs), then the workers' start. Every step is timed into the launch's
:class:`~sparkd.daemon.loop.timing.LaunchTiming`; the outcome is the first failure, or None."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.config import Role
from sparkd.daemon.effects.evidence import FailureEvidence
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.guarding import start_refusal
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.daemon.loop.timing import LaunchTiming
from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock
from sparkd.preflight.base import Check
from sparkd.preflight.runner import PreflightReport, run_preflight
from sparkd.supervisor.failures import Failure

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

Gate = Callable[[], Awaitable[Failure | None]]


class LocalPreflight:
    """This node's checks, before a launch and for an operator (who never touches the watched instance)."""

    def __init__(self, plan: LaunchPlan, checks: tuple[Check, ...], facts: ContainerFacts,
                 evidence: FailureEvidence, log: Any) -> None:
        self.plan = plan
        self.checks = checks
        self.facts = facts  # the image the checks saw, the container's drift read after them
        self.evidence = evidence
        self.log = log
        self.last: list[dict[str, object]] = []  # the last preflight's results, for status, metrics and incidents

    async def run(self, timing: LaunchTiming) -> Failure | None:
        report = await run_preflight(self.plan.context(), self.checks)
        self.last = report.to_json()
        self.facts.saw_image(report.image)
        await self.facts.read_drift()
        for result in report.results:
            timing.step(f"preflight.{result.id}", result.duration_s)
            log = {"warn": self.log.warning, "fail": self.log.error}.get(result.verdict.value, self.log.info)
            log("preflight", check=result.id, verdict=result.verdict.value, found=result.found, did=result.did,
                duration_s=round(result.duration_s, 3))
        self.evidence.log_preflight_failure(report)
        return report.failure()

    async def operator(self, *, dry_run: bool) -> PreflightReport:
        """An operator's (or the head's) preflight: never touches the watched instance."""
        report = await run_preflight(self.plan.context(dry_run=dry_run, protect=True), self.checks)
        if not dry_run:
            self.last = report.to_json()
        return report


class GroupStart:
    """A group head's part of a start: the fabric first, the workers' preflight beside the weights proof, then the
    workers' start. On any other rank every step is nothing."""

    def __init__(self, group: Coordinator | None, checks: GroupChecks | None) -> None:
        self.group = group
        self.checks = checks

    @property
    def head(self) -> Coordinator | None:
        return self.group if self.group is not None and self.group.role is Role.head else None

    async def fabric(self) -> Failure | None:
        return await self.checks.fabric() if self.head is not None and self.checks is not None else None

    async def weights(self) -> Failure | None:
        return await self.checks.weights() if self.head is not None and self.checks is not None else None

    async def prepare_workers(self) -> Failure | None:
        head = self.head
        return await head.prepare_workers() if head is not None else None

    async def start_workers(self) -> Failure | None:
        head = self.head
        return await head.start_workers() if head is not None else None


class Preflight:
    def __init__(self, local: LocalPreflight, group: GroupStart, leftovers: Leftovers, *, before_start: Gate | None,
                 guard: Guard | None, clock: Clock) -> None:
        self.local = local
        self.slot = local.plan.slot
        self.group = group
        self.leftovers = leftovers  # an earlier stop's GPU memory still held refuses the start
        self.before_start = before_start  # the memory settle and the restart gate (restartgate.py)
        self.guard = guard  # its start gate
        self.clock = clock

    async def run(self) -> Failure | None:
        """The start's preflight, timed into a new :class:`LaunchTiming`; the first failure, or None."""
        timing = self.slot.timing = LaunchTiming(requested_at=self.clock.now())
        stuck = await self.leftovers.gate()
        if stuck is not None:
            return stuck
        if self.before_start is not None:  # the memory settle and the restart gate, before anything else
            refusal = await self.before_start()
            timing.step("memory_settle", self.clock.now() - timing.requested_at)
            if refusal is not None:
                return refusal
        lead = self.group.head is not None and self.group.checks is not None
        if lead:  # the fabric first: a few seconds, and a bad link fails the start at once
            fabric = await self._timed(timing, "group.fabric", self.group.fabric)
            if fabric is not None:
                return fabric
        failures: list[Failure | None] = [None, None, None]

        async def local() -> None:
            failures[0] = await self.local.run(timing)

        async def workers() -> None:
            if self.group.head is not None:
                failures[1] = await self._timed(timing, "group.prepare_workers", self.group.prepare_workers)

        async def weights() -> None:
            if lead:
                failures[2] = await self._timed(timing, "group.weights", self.group.weights)

        async with anyio.create_task_group() as tg:
            tg.start_soon(local)
            tg.start_soon(workers)
            tg.start_soon(weights)
        failure = start_refusal(self.guard) or failures[0] or failures[1] or failures[2]
        if failure is None and self.group.head is not None:
            failure = await self._timed(timing, "group.start_workers", self.group.start_workers)
        timing.step("preflight", self.clock.now() - timing.requested_at)
        return failure

    async def _timed(self, timing: LaunchTiming, step: str, run: Gate) -> Failure | None:
        started = self.clock.now()
        failure = await run()
        timing.step(step, self.clock.now() - started)
        return failure
