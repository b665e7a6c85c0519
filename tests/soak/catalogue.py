"""The soak's faults by name (the schedule's kinds), and what the runner expects of each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dockerd import dockerd_restart
from faults import (
    after_daemon_sigkill,
    after_sigstop,
    ctl_storm,
    daemon_sigkill,
    idle_connections,
    link_cut,
    log_flood,
    peer_flood,
    rank_sigstop,
    state_full,
    vllm_sigkill,
)
from invariants import Ledger
from proof_faults import handshake_flood, slow_body
from reloads import broken_config
from soakpair import SoakPair
from wedges import hang, leak, stall

Fault = Callable[[SoakPair, dict[str, Any], Ledger], str]

FAULTS: dict[str, Fault] = {
    "vllm_sigkill": vllm_sigkill, "rank_sigstop": rank_sigstop, "link_cut": link_cut,
    "daemon_sigkill": daemon_sigkill, "ctl_storm": ctl_storm, "idle_connections": idle_connections,
    "log_flood": log_flood, "state_full": state_full, "stall": stall, "hang": hang, "leak": leak,
    "broken_config": broken_config, "dockerd_restart": dockerd_restart, "peer_flood": peer_flood,
    "handshake_flood": handshake_flood, "slow_body": slow_body,
}
# A real failure of a rank: after it both ranks must be new processes (the pair restarts as one unit).
REPLACES_THE_PAIR = frozenset({"vllm_sigkill", "rank_sigstop", "stall", "hang", "leak"})
AFTER: dict[str, Callable[[SoakPair, Ledger], None]] = {"rank_sigstop": after_sigstop,
                                                        "daemon_sigkill": after_daemon_sigkill}


def crashes_a_rank(kind: str, params: dict[str, Any]) -> bool:
    """Does this fault end a rank for real (so the pair must be replaced)? A short link cut may be ridden
    through; with ``crash_after`` a rank is killed once the link is back."""
    return kind in REPLACES_THE_PAIR or bool(params.get("kill_rank") or params.get("crash_after"))

