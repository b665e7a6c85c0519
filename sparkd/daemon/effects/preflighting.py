"""Before every launch: the gates (an earlier stop's GPU memory still held, the memory settle and the restart
gate, the guard's start gate), this node's checks and, on a group's head, the workers' (in parallel with the
fabric and weights proofs), then the workers' start. Under the config the start was decided with; every step is
timed into the launch's :class:`~sparkd.supervisor.timing.LaunchTiming` (``PreflightDone`` carries it to the
launch); the outcome is the first failure, or None."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from sparkd.config import Config, Role
from sparkd.daemon.effects.evidence import FailureEvidence
from sparkd.daemon.effects.facts import ContainerFacts
from sparkd.daemon.effects.groupchecks import GroupChecks
from sparkd.daemon.effects.guarding import start_refusal
from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.plan import LaunchPlan
from sparkd.guard.guard import Guard
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.preflight.base import Check
from sparkd.preflight.runner import PreflightReport, run_preflight
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure
from sparkd.supervisor.timing import LaunchTiming

if TYPE_CHECKING:
    from sparkd.cluster.coordinator import Coordinator

Gate = Callable[[], Awaitable[Failure | None]]
StartGate = Callable[[Config], Awaitable[Failure | None]]  # the memory settle and the restart gate


class LocalPreflight:
    """This node's checks, before a launch and for an operator (who never touches the watched instance)."""

    def __init__(self, plan: LaunchPlan, checks: tuple[Check, ...], facts: ContainerFacts,
                 evidence: FailureEvidence, log: Logger) -> None:
        self.plan = plan
        self.checks = checks
        self.facts = facts  # the image the checks saw, the container's drift read after them
        self.evidence = evidence
        self.log = log
        self.last: list[dict[str, object]] = []  # the last preflight's results, for status, metrics and incidents

    async def run(self, cfg: Config, steps: dict[str, float]) -> Failure | None:
        """The checks under ``cfg``, each timed into ``steps``."""
        report = await run_preflight(self.plan.context(cfg), self.checks)
        self.last = report.to_json()
        self.facts.saw_image(report.image)
        await self.facts.read_drift()
        for result in report.results:
            steps[f"preflight.{result.id}"] = round(result.duration_s, 4)
            log = {"warn": self.log.warning, "fail": self.log.error}.get(result.verdict.value, self.log.info)
            log("preflight", check=result.id, verdict=result.verdict.value, found=result.found, did=result.did,
                duration_s=round(result.duration_s, 3))
        self.evidence.log_preflight_failure(report)
        return report.failure()

    async def operator(self, cfg: Config, *, dry_run: bool, protect: frozenset[int]) -> PreflightReport:
        """An operator's (or the head's) preflight: never touches the watched instance's processes (``protect``)."""
        report = await run_preflight(self.plan.context(cfg, dry_run=dry_run, protect=protect), self.checks)
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

    async def reach(self) -> Failure | None:
        """Every worker's sparkd answering, waited for up to ``peer_grace_s`` (:mod:`sparkd.cluster.reach`)."""
        head = self.head
        if head is None:
            return None
        from sparkd.cluster.reach import reach_workers

        cluster = head.cfg.cluster

        def waiting(now: bool) -> None:  # the status's phase while a worker's sparkd is silent
            head.post(v.Settling("waiting_for_workers" if now else None))

        return await reach_workers(head.client, head.client.peers, grace_s=cluster.peer_grace_s,
                                   poll_s=cluster.peer_poll_s, clock=head.clock, log=head.log, waiting=waiting)

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
    def __init__(self, local: LocalPreflight, group: GroupStart, leftovers: Leftovers, *,
                 before_start: StartGate | None, guard: Guard | None, clock: Clock) -> None:
        self.local = local
        self.group = group
        self.leftovers = leftovers  # an earlier stop's GPU memory still held refuses the start
        self.before_start = before_start  # the memory settle and the restart gate (restartgate.py)
        self.guard = guard  # its start gate
        self.clock = clock

    async def run(self, cfg: Config) -> tuple[Failure | None, LaunchTiming]:
        """The start's preflight under ``cfg``, timed; the first failure (or None) and the start's timing."""
        requested = self.clock.now()
        steps: dict[str, float] = {}
        failure = await self._steps(cfg, requested, steps)
        return failure, LaunchTiming(requested_at=requested, steps=steps)

    async def _steps(self, cfg: Config, requested: float, steps: dict[str, float]) -> Failure | None:
        stuck = await self.leftovers.gate()
        if stuck is not None:
            return stuck
        if self.before_start is not None:  # the memory settle and the restart gate, before anything else
            refusal = await self.before_start(cfg)
            steps["memory_settle"] = round(self.clock.now() - requested, 4)
            if refusal is not None:
                return refusal
        if self.group.head is not None:  # the workers' sparkd first: on a boot of both boxes theirs may come later
            reached = await self._timed(steps, "group.reach", self.group.reach)
            if reached is not None:
                return reached
        lead = self.group.head is not None and self.group.checks is not None
        if lead:  # the fabric first: a few seconds, and a bad link fails the start at once
            fabric = await self._timed(steps, "group.fabric", self.group.fabric)
            if fabric is not None:
                return fabric
        failures: list[Failure | None] = [None, None, None]

        async def local() -> None:
            failures[0] = await self.local.run(cfg, steps)

        async def workers() -> None:
            if self.group.head is not None:
                failures[1] = await self._timed(steps, "group.prepare_workers", self.group.prepare_workers)

        async def weights() -> None:
            if lead:
                failures[2] = await self._timed(steps, "group.weights", self.group.weights)

        async with anyio.create_task_group() as tg:
            tg.start_soon(local)
            tg.start_soon(workers)
            tg.start_soon(weights)
        failure = start_refusal(self.guard) or failures[0] or failures[1] or failures[2]
        if failure is None and self.group.head is not None:
            failure = await self._timed(steps, "group.start_workers", self.group.start_workers)
        steps["preflight"] = round(self.clock.now() - requested, 4)
        return failure

    async def _timed(self, steps: dict[str, float], step: str, run: Gate) -> Failure | None:
        started = self.clock.now()
        failure = await run()
        steps[step] = round(self.clock.now() - started, 4)
        return failure
