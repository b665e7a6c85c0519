"""The pair as one unit, from the head's side: prepare and start the workers, stop them, watch them.

Field facts (community-recipes §14, vllm-runtime-surface §5): a headless worker hangs forever when the head
dies; the head's /health stays 200 for minutes after the worker dies; restarting one rank mid-boot kills the
other's TCPStore; the worker must start first. So every start and restart of the head stops every rank,
verifies no ``VLLM::*`` is left, preflights all nodes, starts the workers, waits for their ranks to reach the
rendezvous, and only then starts the head.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from sparkd.cluster.peers import PeerClient, PeerUnreachable
from sparkd.cluster.shared import differences, image_difference, rank_gone, rank_waiting_or_later, shared_settings
from sparkd.supervisor import machine as sm
from sparkd.supervisor.failures import Failure, FailureClass

if TYPE_CHECKING:
    from sparkd.daemon import Daemon


def pair_failure(cls: FailureClass, sentence: str) -> Failure:
    return Failure(cls=cls, sentence=sentence, exit_code=None, signal=None, evidence=None)


class PeerView:
    """What this daemon last saw of one peer."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.reachable = False
        self.last_seen: float | None = None
        self.since_unreachable: float | None = None


class Coordinator:
    def __init__(self, daemon: Daemon, client: PeerClient) -> None:
        self.daemon = daemon
        self.client = client
        self.views = {peer: PeerView() for peer in client.peers}

    # ---- head: prepare and start the workers
    async def _each(self, job: Any) -> Failure | None:
        """Run ``job(peer)`` for every worker in parallel; the first failure, or None."""
        failures: list[Failure] = []

        async def one(peer: str) -> None:
            try:
                failure = await job(peer)
            except PeerUnreachable as exc:
                failure = pair_failure(FailureClass.peer_lost, f"The worker's sparkd at {peer} cannot be reached "
                                       f"({exc}); the head waits for it with backoff instead of starting alone.")
            if failure is not None:
                failures.append(failure)

        async with anyio.create_task_group() as tg:
            for peer in self.client.peers:
                tg.start_soon(one, peer)
        return failures[0] if failures else None

    async def check_and_clean_workers(self) -> Failure | None:
        """Every worker: same launch settings and image, its rank stopped with no VLLM::* left, preflight ok.
        Runs beside the head's own preflight."""
        return await self._each(self._check_and_clean)

    async def start_workers(self) -> Failure | None:
        """Start every worker rank and wait until each is up and waiting for the master (workers first)."""
        failure = await self._each(self._start_one)
        if failure is not None:
            await self.stop_workers()
        return failure

    async def _check_and_clean(self, peer: str) -> Failure | None:
        d = self.daemon
        status = await self.client.status(peer)
        mismatch = differences(shared_settings(d.cfg), status.get("shared", {}), peer=peer)
        image = image_difference(d.image_id, status.get("image_id"), peer=peer)
        if image:
            mismatch.insert(0, image)
        if mismatch:
            return pair_failure(FailureClass.config_error,
                                f"The pair's launch settings differ: {'; '.join(mismatch)}; make both configs "
                                "agree — sparkd will not start a mismatched pair.")
        stopped = await self.client.request(peer, "POST", "/v1/rank/stop", timeout_s=self._stop_timeout())
        if stopped.get("vllm_left"):
            return pair_failure(FailureClass.gpu_busy, f"VLLM::* processes are left on {peer} after stopping its "
                                f"rank: {stopped['vllm_left']}")
        report = await self.client.request(peer, "POST", "/v1/rank/preflight", timeout_s=600)
        if not report.get("ok", False):
            return self._remote_failure(peer, report.get("failure"), "its preflight failed")
        return None

    async def _start_one(self, peer: str) -> Failure | None:
        await self.client.request(peer, "POST", "/v1/rank/start")
        deadline = time.monotonic() + self.daemon.cfg.cluster.worker_start_timeout_s
        while time.monotonic() < deadline:
            status = await self.client.status(peer)
            if rank_waiting_or_later(status):
                self.daemon.log.info("worker_rank_up", peer=peer, pid=status.get("pid"), phase=status.get("phase"))
                return None
            if status.get("state") in ("stopped", "failed") and status.get("last_failure"):
                return self._remote_failure(peer, status.get("last_failure"), "its rank did not start")
            await anyio.sleep(0.2)
        return pair_failure(FailureClass.hang, f"The worker rank on {peer} was not up after "
                            f"{self.daemon.cfg.cluster.worker_start_timeout_s:.0f} s.")

    def _remote_failure(self, peer: str, failure: dict[str, Any] | None, what: str) -> Failure:
        failure = failure or {}
        cls = FailureClass(failure.get("class", "unknown")) if failure.get("class") in FailureClass.__members__ \
            else FailureClass.unknown
        message = failure.get("message", "no reason given")
        return pair_failure(cls, f"The worker on {peer}: {what}: {message}")

    def _stop_timeout(self) -> float:
        return self.daemon.cfg.supervisor.stop_grace_s + 60.0

    async def stop_workers(self) -> None:
        async def one(peer: str) -> None:
            try:
                result = await self.client.request(peer, "POST", "/v1/rank/stop", timeout_s=self._stop_timeout())
                if result.get("vllm_left"):
                    self.daemon.log.warning("worker_vllm_left", peer=peer, pids=result["vllm_left"])
            except PeerUnreachable as exc:
                self.daemon.log.warning("worker_stop_unreachable", peer=peer, error=str(exc))

        async with anyio.create_task_group() as tg:
            for peer in self.client.peers:
                tg.start_soon(one, peer)

    # ---- both sides: watch the peers
    async def watch(self) -> None:
        poll = self.daemon.cfg.cluster.peer_poll_s
        while True:
            async with anyio.create_task_group() as tg:
                for peer in self.client.peers:
                    tg.start_soon(self._poll, peer)
            self._judge(time.monotonic())
            await anyio.sleep(poll)

    async def _poll(self, peer: str) -> None:
        view, now = self.views[peer], time.monotonic()
        try:
            view.status = await self.client.request(peer, "GET", "/v1/status", retries=0)
            view.reachable, view.last_seen, view.since_unreachable = True, now, None
        except PeerUnreachable:
            if view.reachable or view.since_unreachable is None:
                view.since_unreachable = now
                self.daemon.log.warning("peer_unreachable", peer=peer)
            view.reachable = False

    def _judge(self, now: float) -> None:
        d = self.daemon
        grace = d.cfg.cluster.peer_grace_s
        running = d.machine.state in sm.RUNNING
        for peer, view in self.views.items():
            lost_for = now - view.since_unreachable if view.since_unreachable is not None else 0.0
            if d.pair == "worker":
                if not view.reachable and lost_for >= grace and running:
                    d.log.warning("head_lost", peer=peer, seconds=round(lost_for, 1))
                    d.post(sm.HealthFailed(pair_failure(
                        FailureClass.peer_lost, f"The head's sparkd at {peer} has been unreachable for "
                        f"{lost_for:.0f} s; a headless rank cannot serve alone, so sparkd stopped it.")))
                continue
            if not running:
                continue
            if not view.reachable and lost_for >= grace:
                d.post(sm.HealthFailed(pair_failure(
                    FailureClass.peer_lost, f"The worker's sparkd at {peer} has been unreachable for "
                    f"{lost_for:.0f} s (node down, frozen, or the link is cut); sparkd stops the head's rank and "
                    "waits for the worker.")))
            elif view.reachable and view.status is not None and rank_gone(view.status):
                self._worker_rank_failed(peer, view.status.get("last_failure"))

    def _worker_rank_failed(self, peer: str, failure: dict[str, Any] | None) -> None:
        self.daemon.post(sm.HealthFailed(self._remote_failure(peer, failure, "its rank is gone")))

    def on_report(self, peer: str, failure: dict[str, Any] | None) -> None:
        """A worker reported its rank's failure at once (POST /v1/rank/failed)."""
        if self.daemon.machine.state in sm.RUNNING:
            self._worker_rank_failed(peer, failure)

    def peers_json(self) -> list[dict[str, Any]]:
        return [{"peer": peer, "reachable": v.reachable,
                 "state": (v.status or {}).get("state"), "pid": (v.status or {}).get("pid")}
                for peer, v in self.views.items()]

    async def report_failure(self, failure: Failure) -> None:
        """Worker side: tell the head at once that this rank failed."""
        body = {"failure": {"class": failure.cls.value, "message": failure.sentence}}
        for peer in self.client.peers:
            try:
                await self.client.request(peer, "POST", "/v1/rank/failed", json=body, retries=1)
            except PeerUnreachable as exc:
                self.daemon.log.warning("report_unreachable", peer=peer, error=str(exc))
