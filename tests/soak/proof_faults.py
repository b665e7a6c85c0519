"""Review 2's faults (issue 34): a local user on the worker — not root, the worker's own address — floods the
head's port with connections that never begin their handshake (no TLS ClientHello, no request), or holds
connections whose request body never comes. Neither may cost the pair its peer (no ``peer_lost``: both ranks the
same processes), and the head daemon's memory must come back within :data:`RSS_BACK_MIB` of where it was."""

from __future__ import annotations

import time
from typing import Any

from attack_tools import LOCAL_USER, footprint, holder, outcome
from invariants import Ledger
from soakpair import SoakPair

RSS_BACK_MIB = 10
SETTLE_S = 5.0  # the last connections' handshake and request deadlines (2 s each), and the allocator's turn


def _held_by_a_local_user(pair: SoakPair, params: dict[str, Any], ledger: Ledger, mode: str, what: str) -> str:
    head = pair.head
    if head.proc is None or head.proc.poll() is not None:
        return "no head daemon to flood"
    pid, port = head.proc.pid, int(head.config["api"]["port"])
    ranks = {name: pair.rank_pid(name) for name in pair.daemons}
    lost = {name: d.log().count('"peer_lost"') for name, d in pair.daemons.items()}
    rss_before = footprint(pid)[0]
    proc = holder(["ip", "netns", "exec", pair.link.worker_ns, *LOCAL_USER], pair.link.head_addr, port,
                  params["count"], params["hold_s"], mode, rate=params.get("rate", 50))
    try:
        stats = outcome(proc, params["hold_s"] + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    time.sleep(SETTLE_S)
    rss_after = footprint(pid)[0]
    if {name: pair.rank_pid(name) for name in pair.daemons} != ranks:
        ledger.add(f"{what} from a local user on the worker replaced a rank (peer_lost)")
    for name, daemon in pair.daemons.items():
        if daemon.log().count('"peer_lost"') > lost[name]:
            ledger.add(f"{what} from a local user on the worker: the {name} logged peer_lost")
    grown = (rss_after - rss_before) / (1 << 20)
    if grown > RSS_BACK_MIB:
        ledger.add(f"{what}: the head daemon's RSS stayed {grown:.0f} MiB above where it was (at most "
                   f"{RSS_BACK_MIB} MiB)")
    return (f"{what}: {stats['opened']} opened, {stats['closed']} closed by the head, longest {stats['longest']:.1f} "
            f"s; head RSS {rss_before >> 20} → {rss_after >> 20} MiB")


def handshake_flood(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """Up to ``count`` connections that send nothing — no ClientHello under TLS, no request without it."""
    return _held_by_a_local_user(pair, params, ledger, "silent", f"a flood of {params['count']} silent connections")


def slow_body(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    """``count`` requests whose announced body never comes (after a handshake without a certificate, under TLS)."""
    mode = "tls-body" if pair.head.config["api"].get("tls_key") else "body"
    return _held_by_a_local_user(pair, params, ledger, mode, f"{params['count']} body-less requests")
