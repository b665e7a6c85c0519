"""A group of ranks as one unit: the head prepares, starts and stops the workers; both sides watch each other.

Field facts (community-recipes §14, vllm-runtime-surface §5): a headless worker hangs forever when the head
dies; the head's /health stays 200 for minutes after a worker dies; restarting one rank mid-boot kills the
others' TCPStore; the workers must start first. So every start and restart of the head stops every rank,
verifies no ``VLLM::*`` is left, preflights all nodes, starts the workers (in parallel), waits for their ranks
to reach the rendezvous, and only then starts the head.

The coordinator sees its own node through two narrow ports — ``post`` (an observation) and ``state`` (the
lifecycle state) — and its peers through the peer link (:class:`~sparkd.cluster.peers.PeerClient`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.cluster.addresses import PeerAddresses
from sparkd.cluster.peers import PeerClient, PeerRefused, PeerUnreachable, claim, wire
from sparkd.cluster.ranks import Member, group_problems, group_role
from sparkd.cluster.reach import worker_unreachable
from sparkd.cluster.shared import (
    build_differences,
    builds_of,
    differences,
    head_ends_the_group,
    image_difference,
    rank_gone,
    rank_waiting_or_later,
    shared_settings,
)
from sparkd.commands import reload as reload_command
from sparkd.commands.base import NoParams
from sparkd.commands.port import Outgoing, Route
from sparkd.commands.rank import (
    RANK_FAILED,
    RANK_PREFLIGHT,
    RANK_START,
    RANK_STEPS,
    RANK_STOP,
    Failed,
    failure_report,
)
from sparkd.commands.statusdoc import PeerEntry, Status
from sparkd.config import Config, Role
from sparkd.host.clock import Clock
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.graces import stop_wait_s
from sparkd.supervisor.states import RUNNING, State

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

START_POLL_S = 0.2
STEPS_TIMEOUT_S = 2.0  # a worker's step records: one reading's worth, or left out of it


def clock_offset(peer_wall: Any, sent: float, answered: float) -> float | None:
    """The peer's wall clock minus ours, from one exchange: its status was rendered about halfway between our
    request and its answer (error: half the round trip)."""
    if isinstance(peer_wall, bool) or not isinstance(peer_wall, int | float):
        return None
    return float(peer_wall) - (sent + answered) / 2


class PeerView:
    """What this daemon last saw of one peer."""

    def __init__(self) -> None:
        self.status: Status | None = None
        self.reachable = False
        self.last_seen: float | None = None
        self.since_unreachable: float | None = None
        self.offset_s: float | None = None  # its wall clock minus ours, from the last answer (the flight recorder's)


def _peer_entry(peer: str, reachable: bool, status: Status | None) -> PeerEntry:
    status = status or Status()
    failure = status.get("last_failure")
    return {"peer": peer, "reachable": reachable, "node": status.get("node"), "rank": status.get("rank"),
            "state": status.get("state"), "pid": status.get("pid"),
            "last_failure": failure.get("class") if failure else None}


class Coordinator:
    def __init__(self, config: Callable[[], Config], client: PeerClient, *, post: Callable[[v.Posted], None],
                 state: Callable[[], State], image: Callable[[], dict[str, Any] | None], clock: Clock,
                 log: Logger, addresses: PeerAddresses | None = None) -> None:
        self.config = config  # the config in force, read at every start, stop and poll
        self.role = group_role(config())
        self.client = client
        self.post = post
        self.state = state
        self.image = image
        self.clock = clock
        self.log = log
        self.views = {peer: PeerView() for peer in client.peers}
        self.addresses = addresses

    @property
    def cfg(self) -> Config:
        """The config in force (a reload is read from the next use on)."""
        return self.config()

    # ---- head: prepare, start and stop the workers
    async def _each(self, job: Callable[[str], Awaitable[Failure | None]]) -> Failure | None:
        """Run ``job(peer)`` for every worker in parallel; the first failure, or None."""
        failures: list[Failure] = []

        async def one(peer: str) -> None:
            try:
                failure = await job(peer)
            except PeerUnreachable as exc:
                failure = worker_unreachable(peer, str(exc))
            except PeerRefused as exc:
                failure = Failure.of(FailureClass.unknown, f"The worker's sparkd at {peer}: {exc}.")
            if failure is not None:
                failures.append(failure)

        async with anyio.create_task_group() as tg:
            for peer in self.client.peers:
                tg.start_soon(one, peer)
        return failures[0] if failures else None

    async def prepare_workers(self) -> Failure | None:
        """Every worker reachable; the ranks form a group; same launch settings and image everywhere; every
        rank stopped with no VLLM::* left; every preflight ok. Runs beside the head's own preflight."""
        statuses: dict[str, Status] = {}

        async def fetch(peer: str) -> None:
            statuses[peer] = await self.client.status(peer)

        failure = await self._each(fetch)
        if failure is not None:
            return failure
        members = [self._member(), *(Member.from_status(statuses[peer], peer) for peer in self.client.peers)]
        problems = group_problems(members)
        if problems:
            return Failure.of(FailureClass.config_error, f"The group cannot form: {'; '.join(problems)}; fix "
                              "node.rank, cluster.nnodes or the parallel sizes — sparkd will not start it.")
        mismatch = [line for peer in self.client.peers for line in self._differences(peer, statuses[peer])]
        if mismatch:
            return Failure.of(FailureClass.config_error, f"The group's launch settings differ: {'; '.join(mismatch)}; "
                              "make every config agree — sparkd will not start a mismatched group.")
        return await self._each(self._clean)

    def _member(self) -> Member:
        launch = self.cfg.launch
        return Member(node=self.cfg.node.name, where="this node", rank=self.cfg.node_rank, nnodes=self.cfg.nnodes,
                      tensor_parallel_size=launch.tensor_parallel_size or 1,
                      pipeline_parallel_size=launch.pipeline_parallel_size or 1,
                      gpus_per_node=self.cfg.cluster.gpus_per_node, head=True)

    def _differences(self, peer: str, status: Status) -> list[str]:
        mine = shared_settings(self.cfg, getattr(self.client, "token", None))
        mismatch = differences(mine, status.get("shared", {}), peer=peer)
        image = image_difference(self.image(), status.get("image") or status.get("image_id"), peer=peer,
                                 mode=self.cfg.cluster.image_match, label=self.cfg.cluster.image_label)
        return [image, *mismatch] if image else mismatch

    async def start_workers(self) -> Failure | None:
        """Start every worker rank and wait until each is up and waiting for the master (workers first), once the
        builds every rank's preflight read agree."""
        failure = await self._builds_differ()
        if failure is not None:
            return failure
        failure = await self._each(self._start_one)
        if failure is not None:
            await self.stop_workers()
        return failure

    async def _builds_differ(self) -> Failure | None:
        """The ranks' builds (vLLM, torch, CUDA, NCCL and its library), as this start's preflights read them, compared
        (``build-parity``, sparkd.cluster.shared rule 3)."""
        mine = builds_of(self.image())
        if not mine or "build-parity" in self.cfg.lint.allow:
            return None
        found: list[str] = []

        async def compare(peer: str) -> Failure | None:
            found.extend(build_differences(mine, builds_of(await self.client.status(peer)), peer=peer))
            return None

        failure = await self._each(compare)
        if failure is not None or not found:
            return failure
        return Failure.of(FailureClass.config_error, f"The group's builds differ: {'; '.join(found)}; run one image "
                          "(one NCCL build) on every node — the same NCCL version built twice hung a pair (vllm "
                          "#42354), NCCL 2.28.9 against 2.30.4 broke CUDA graphs across nodes (vllm #52504); sparkd "
                          "will not start a mismatched group ([lint] allow = [\"build-parity\"] accepts it).")

    async def _clean(self, peer: str) -> Failure | None:
        started = self.clock.now()
        failure = await self._stop_and_preflight(peer)
        self.log.info("worker_prepared", peer=peer, ok=failure is None, duration_s=self._since(started))
        return failure

    async def _stop_and_preflight(self, peer: str) -> Failure | None:
        stopped = await self.client.call(peer, RANK_STOP, NoParams(), timeout_s=self._stop_timeout())
        if stopped.get("vllm_left"):
            return Failure.of(FailureClass.gpu_busy, f"vLLM processes of its rank are left on {peer} after "
                              f"stopping it: {stopped['vllm_left']}")
        report = await self.client.call(peer, RANK_PREFLIGHT, NoParams(), timeout_s=600)
        if not report.get("ok", False):
            return self._remote_failure(peer, report.get("failure"), "its preflight failed")
        return None

    async def _start_one(self, peer: str) -> Failure | None:
        started = self.clock.now()
        await self.client.call(peer, RANK_START, NoParams())
        timeout = self.cfg.cluster.worker_start_timeout_s
        deadline = self.clock.now() + timeout
        while self.clock.now() < deadline:
            status = await self.client.status(peer)
            if rank_waiting_or_later(status):
                self.log.info("worker_rank_up", peer=peer, pid=status.get("pid"), phase=status.get("phase"),
                              duration_s=self._since(started))
                return None
            if status.get("state") in ("stopped", "failed") and status.get("last_failure"):
                return self._remote_failure(peer, status.get("last_failure"), "its rank did not start")
            await self.clock.sleep(START_POLL_S)
        return Failure.of(FailureClass.hang, f"The worker rank on {peer} was not up after {timeout:.0f} s.")

    def _remote_failure(self, peer: str, failure: Mapping[str, Any] | None, what: str) -> Failure:
        """The worker's report as a failure of the group: the class if it is one sparkd knows, and its sentence
        quoted as the worker's claim (one line, bounded: it came over the network)."""
        failure = failure if isinstance(failure, dict) else {}
        name = str(failure.get("class"))
        cls = FailureClass(name) if name in FailureClass.__members__ else FailureClass.unknown
        said = claim(failure.get("message") or "no reason given")
        return Failure.of(cls, f"The worker on {peer}: {what}; its sparkd reports: \u201c{said}\u201d")

    def _stop_timeout(self) -> float:
        return stop_wait_s(self.cfg) + 30.0  # the worker's own wait, and the way there and back

    def _since(self, started: float) -> float:
        """Seconds since ``started``, precise enough to tell from the log which workers overlapped."""
        return round(self.clock.now() - started, 6)

    async def stop_workers(self) -> None:
        async def one(peer: str) -> None:
            retries = 0 if not self.views[peer].reachable else 2  # a lost node gets one try, not three
            started = self.clock.now()
            try:
                result = await self.client.call(peer, RANK_STOP, NoParams(), timeout_s=self._stop_timeout(),
                                                retries=retries)
                if result.get("vllm_left"):
                    self.log.warning("worker_vllm_left", peer=peer, pids=result["vllm_left"])
                self.log.info("worker_stopped", peer=peer, duration_s=self._since(started))
            except (PeerUnreachable, PeerRefused) as exc:
                self.log.warning("worker_stop_failed", peer=peer, error=str(exc))

        async with anyio.create_task_group() as tg:
            for peer in self.client.peers:
                tg.start_soon(one, peer)

    # ---- both sides: watch the peers
    async def watch(self) -> None:
        while True:
            async with anyio.create_task_group() as tg:
                for peer in self.client.peers:
                    tg.start_soon(self._poll, peer)
            self._judge(self.clock.now())
            await self.clock.sleep(self.cfg.cluster.peer_poll_s)

    async def _poll(self, peer: str) -> None:
        view, now, sent = self.views[peer], self.clock.now(), self.clock.wall()
        try:
            view.status = await self.client.status(peer, retries=0)
            view.reachable, view.last_seen, view.since_unreachable = True, now, None
            view.offset_s = clock_offset(view.status.get("updated_at"), sent, self.clock.wall())
        except (PeerUnreachable, PeerRefused) as exc:
            if view.reachable or view.since_unreachable is None:
                view.since_unreachable = now
                self.log.warning("peer_unreachable", peer=peer, error=str(exc))
            view.reachable = False

    def _judge(self, now: float) -> None:
        if self.state() not in RUNNING:
            return
        grace = self.cfg.cluster.peer_grace_s
        for peer, view in self.views.items():
            lost_for = now - view.since_unreachable if view.since_unreachable is not None else 0.0
            lost = not view.reachable and lost_for >= grace
            if self.role is Role.worker:
                if lost:
                    self.log.warning("head_lost", peer=peer, seconds=round(lost_for, 1))
                    self.post(v.HealthFailed(Failure.of(
                        FailureClass.peer_lost, f"The head's sparkd at {peer} has been unreachable for "
                        f"{lost_for:.0f} s; a headless rank cannot serve alone, so sparkd stopped it.")))
            elif lost:
                self.post(v.HealthFailed(Failure.of(
                    FailureClass.peer_lost, f"The worker's sparkd at {peer} has been unreachable for "
                    f"{lost_for:.0f} s (node down, frozen, or the link is cut); sparkd stops the head's rank and "
                    "waits for the worker.")))
            elif view.reachable and view.status is not None and rank_gone(view.status):
                self._worker_rank_failed(peer, view.status.get("last_failure"))

    def _worker_rank_failed(self, peer: str, failure: Mapping[str, Any] | None) -> None:
        # this rank's peer is gone: it spins in its next collective and ignores SIGTERM (tests/gpu/README.md)
        self.post(v.HealthFailed(self._remote_failure(peer, failure, "its rank is gone"), hung=True))

    def on_report(self, peer: str, failure: Mapping[str, Any] | None) -> bool:
        """A worker reported its rank's failure at once (POST /v1/rank/failed from ``peer``, its address); False
        when the address is not a configured peer's (the report is then ignored)."""
        named = self.peer_named(peer)
        if named is None:
            self.log.warning("report_refused", source=peer, reason="not a configured peer")
            return False
        if self.state() in RUNNING:
            self._worker_rank_failed(named, failure)
        return True

    async def worker_steps(self) -> list[tuple[str, dict[str, Any]]]:
        """Head side (the step probe, issue 38): every reachable worker's step records now, ``(peer, its answer)``;
        a worker that does not answer at once (or whose sparkd predates the probe) is left out of this reading."""
        answers: list[tuple[str, dict[str, Any]]] = []

        async def one(peer: str) -> None:
            try:
                answer = await self.client.call(peer, RANK_STEPS, NoParams(), retries=0, timeout_s=STEPS_TIMEOUT_S)
            except (PeerUnreachable, PeerRefused):
                return
            answers.append((peer, dict(answer)))

        async with anyio.create_task_group() as tg:
            for peer, view in self.views.items():
                if view.reachable:
                    tg.start_soon(one, peer)
        return answers

    async def head_stops_the_group(self) -> bool:
        """Worker side, its rank having lost the head: whether the head's sparkd says it stops the group (asked now:
        the last poll may predate the head's stop, whose rank ends before its order reaches this worker)."""
        head = self.client.peers[0] if self.role is Role.worker else None
        try:
            return head is not None and head_ends_the_group(await self.client.status(head, retries=0))
        except (PeerUnreachable, PeerRefused):
            return False

    def unreachable(self) -> list[str]:
        """The peers whose sparkd does not answer now."""
        return [peer for peer, view in self.views.items() if view.since_unreachable is not None]

    def peer_named(self, host: str) -> str | None:
        """The configured peer a request from address ``host`` came from; None for any other address."""
        if self.addresses is None:
            self.addresses = PeerAddresses(self.client.peers)
        return self.addresses.peer_of(host)

    def peers_json(self) -> list[PeerEntry]:
        """Every other rank of the group: the head knows them all; a worker shows the head's view of the rest."""
        out = [_peer_entry(peer, view.reachable, view.status) for peer, view in self.views.items()]
        if self.role is Role.worker:
            for view in self.views.values():
                others = (view.status or {}).get("peers") or []
                out.extend({**p, "via": "the head"} for p in others if p.get("node") != self.cfg.node.name)
        return out

    async def report_failure(self, failure: Failure) -> None:
        """Worker side: tell the head at once that this rank failed."""
        report = failure_report(failure)
        for peer in self.client.peers:
            try:
                await self.client.call(peer, RANK_FAILED, Failed(report, peer), retries=1)
            except (PeerUnreachable, PeerRefused) as exc:
                self.log.warning("report_failed", peer=peer, error=str(exc))

    async def reload_workers(self) -> list[str]:
        """Head side, before an operator's restart: every worker takes on its config on disk (or says why not)."""
        problems: list[str] = []

        async def one(peer: str) -> None:
            try:
                await self.client.call(peer, reload_command.COMMAND, NoParams(), timeout_s=60)
            except PeerRefused as exc:
                problems.append(f"the worker on {peer}: {exc}")
            except PeerUnreachable as exc:  # the restart waits for it like any start does
                self.log.warning("worker_reload_unreachable", peer=peer, error=str(exc))

        if self.role is Role.head:
            async with anyio.create_task_group() as tg:
                for peer in self.client.peers:
                    tg.start_soon(one, peer)
        return problems

    async def forward(self, command: Route, request: Outgoing | None = None, *,
                      timeout_s: float | None = None) -> tuple[bool, dict[str, Any]]:
        """Worker side: an operator command (with ``request``'s parameters), carried out by the head for the whole
        group."""
        head = self.client.peers[0]
        method, path, body = (command.method, command.path, None) if request is None else wire(command, request)
        try:
            answer = await self.client.envelope(head, method, path, retries=1, timeout_s=timeout_s, json=body)
        except PeerUnreachable as exc:
            return False, {"error": f"the head is unreachable ({exc}); use --local to act on this rank alone"}
        return bool(answer.get("ok")), {**answer, "forwarded_to": head}
