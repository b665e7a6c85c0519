"""Peer loss as the core decides it: the log lines that say a rank's peer is gone, a wedge seen while a peer's sparkd is
unreachable, and when a rank's loss cannot be another node's.

A headless rank whose head went away hangs forever printing torch's TCPStore lines (reference §5.3): the classifier's
rules (:mod:`sparkd.supervisor.rules`) and the instance watch read the same :data:`PEER_LOST_MARKERS`. A hang or a
stall seen while the sparkd of a peer does not answer is that peer's loss: the canary's timeout and the peer's grace
race, and the cause decides whether the group waits (``peer_lost`` spends no budget) or counts.

A rank's loss is another node's only where there is another node. Where the daemon knows this node runs vLLM alone
(`ClassifyContext.group` is False), every rank vLLM lost was a process of its own on this host; and where the log
itself names the death of rank 0 — the rank that serves the group's TCPStore — by this engine's executor, the store's
loss is that death's echo (:func:`store_owner_died_here`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sparkd.supervisor.failures import Failure, FailureClass

__all__ = ["PEER_LOST_MARKERS", "WEDGES", "names_peer_loss", "names_store_loss", "store_owner_died_here",
           "wedge_or_peer_lost"]

# torch's words on a rank whose peer's TCPStore went away (its recvValue failure, the store's own shutdown)
PEER_LOST_MARKERS = ("Connection was likely closed", "TCPStore server has shut down")
WEDGES = frozenset({FailureClass.hang, FailureClass.stall})  # what a peer's loss looks like from this rank


# vLLM's multiprocessing executor names each worker after its rank in the group (`VllmWorker-{rank}`; a node's ranks
# follow the nodes before it, so a headless node's never include 0) and reports the death of its own workers only, from
# the same host; rank 0 serves the TCPStore the group's ranks watch. A data-parallel engine other than the first
# (`EngineCore_DP1`, before 0.11 `EngineCore_1`) numbers its workers from 0 too, but the group's store is the first
# engine's: not read there.
_STORE_OWNER_DIED = re.compile(r"\bWorker proc VllmWorker-0 died unexpectedly\b")
_OTHER_DP_ENGINE = re.compile(r"_(?:DP)?[1-9]\d*$")


def names_peer_loss(text: str) -> bool:
    """Whether a (cleaned) log line is torch saying this rank's peer is gone."""
    return any(marker in text for marker in PEER_LOST_MARKERS)


def names_store_loss(text: str) -> bool:
    """Whether a line reports the TCPStore gone (its connection closed, the store shut down, its flag unreadable)."""
    return names_peer_loss(text) or "TCPStore" in text


def store_owner_died_here(text: str, process: str | None) -> bool:
    """Whether a line is this engine's executor reporting the death of its worker of rank 0, the TCPStore's owner: on
    one host, and on the head of a group alike, a store then lost is that worker's, not another node's (a headless
    node's executor never has a rank 0 to report)."""
    return (_STORE_OWNER_DIED.search(text) is not None
            and (process is None or _OTHER_DP_ENGINE.search(process) is None))


def wedge_or_peer_lost(failure: Failure, unreachable: Sequence[str]) -> Failure:
    """``failure`` as it stands, or — a hang or stall while the sparkd of ``unreachable`` peers does not answer —
    the peer's loss, quoting the wedge's sentence as its evidence."""
    if failure.cls not in WEDGES or not unreachable:
        return failure
    return Failure.of(FailureClass.peer_lost, f"vLLM stopped answering while the sparkd of "
                      f"{', '.join(unreachable)} is unreachable: the peer is gone (node down, frozen, or the link is "
                      "cut); sparkd stops this rank and waits for the peer.", evidence=failure.sentence)
