"""The head's first step of a group's start: every worker's sparkd answering, waited for up to ``peer_grace_s``.

Two boxes powered on together, or a worker's sparkd being upgraded, answer a few seconds after the head asks: a
refusal then is no loss of the peer, and filing it as one (an incident, ``peer_lost``, a backoff) on every boot
would teach operators to ignore the class. ``[cluster] peer_grace_s`` already says how long a peer may be silent
before it is lost while the group runs; a start waits the same, polling every ``peer_poll_s``, and starts the moment
the last worker answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sparkd.cluster.peers import PeerClient, PeerRefused, PeerUnreachable
from sparkd.supervisor.failures import Failure, FailureClass

if TYPE_CHECKING:
    from sparkd.host.clock import Clock
    from sparkd.host.logs import Logger


def worker_unreachable(peer: str, why: str) -> Failure:
    """The head's words for a worker whose sparkd does not answer at a start."""
    return Failure.of(FailureClass.peer_lost, f"The worker's sparkd at {peer} cannot be reached ({why}); the head "
                      "waits for it with backoff instead of starting alone.")


async def reach_workers(client: PeerClient, peers: Iterable[str], *, grace_s: float, poll_s: float, clock: Clock,
                        log: Logger, waiting: Callable[[bool], None] = lambda _: None) -> Failure | None:
    """None once every peer's sparkd answers (a refusal is an answer: its reason is the next step's to give); a
    ``peer_lost`` failure naming the first silent peer once ``grace_s`` has passed without its answer.
    ``waiting(True)`` once a peer is silent, ``waiting(False)`` when that wait ends however it ends (the status's
    phase)."""
    silent = list(peers)
    started = clock.now()
    why: dict[str, str] = {}  # each peer that did not answer: its last reason
    try:
        while True:
            for peer in list(silent):
                try:
                    await client.status(peer, retries=0)
                except PeerUnreachable as exc:
                    if not why:
                        waiting(True)
                    if peer not in why:
                        log.warning("waiting_for_worker", peer=peer, error=str(exc), grace_s=grace_s)
                    why[peer] = str(exc)
                    continue
                except PeerRefused:
                    pass
                silent.remove(peer)
                if peer in why:
                    log.info("worker_reached", peer=peer, waited_s=round(clock.now() - started, 1))
            if not silent:
                return None
            waited = clock.now() - started
            if waited >= grace_s:
                peer = silent[0]
                said = f"; silent for {waited:.0f} s of the {grace_s:g} s grace" if grace_s > 0 else ""
                return worker_unreachable(peer, why[peer] + said)
            await clock.sleep(min(poll_s, grace_s - waited))
    finally:
        if why:
            waiting(False)
