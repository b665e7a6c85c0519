"""Peer loss as the core decides it: the log lines that say a rank's peer is gone, and a wedge seen while a peer's
sparkd is unreachable.

A headless rank whose head went away hangs forever printing torch's TCPStore lines (reference §5.3): the classifier's
rules (:mod:`sparkd.supervisor.rules`) and the instance watch read the same :data:`PEER_LOST_MARKERS`. A hang or a
stall seen while the sparkd of a peer does not answer is that peer's loss: the canary's timeout and the peer's grace
race, and the cause decides whether the group waits (``peer_lost`` spends no budget) or counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkd.supervisor.failures import Failure, FailureClass

__all__ = ["PEER_LOST_MARKERS", "WEDGES", "names_peer_loss", "wedge_or_peer_lost"]

# torch's words on a rank whose peer's TCPStore went away (its recvValue failure, the store's own shutdown)
PEER_LOST_MARKERS = ("Connection was likely closed", "TCPStore server has shut down")
WEDGES = frozenset({FailureClass.hang, FailureClass.stall})  # what a peer's loss looks like from this rank


def names_peer_loss(text: str) -> bool:
    """Whether a (cleaned) log line is torch saying this rank's peer is gone."""
    return any(marker in text for marker in PEER_LOST_MARKERS)


def wedge_or_peer_lost(failure: Failure, unreachable: Sequence[str]) -> Failure:
    """``failure`` as it stands, or — a hang or stall while the sparkd of ``unreachable`` peers does not answer —
    the peer's loss, quoting the wedge's sentence as its evidence."""
    if failure.cls not in WEDGES or not unreachable:
        return failure
    return Failure.of(FailureClass.peer_lost, f"vLLM stopped answering while the sparkd of "
                      f"{', '.join(unreachable)} is unreachable: the peer is gone (node down, frozen, or the link is "
                      "cut); sparkd stops this rank and waits for the peer.", evidence=failure.sentence)
