"""Pure fabric decisions: what the two ends of one head–worker link and the probes between them say, as
findings that name the node, the interface and the value. The I/O is in :mod:`sparkd.cluster.fabric_probe`
(one end) and :mod:`sparkd.cluster.fabric_check` (the head, for the group).

Rules, in the order a finding is reported (the first one decides the class, ``CAUSES`` in
:mod:`sparkd.supervisor.failures`):

1. ``link_down``: either end's fabric interface is missing, down or without carrier (it can come back: wait).
   An end whose config names no fabric interface and no address is not checked (:func:`unchecked`): a warning,
   not a refusal.
2. ``peer_unreachable``: no small echo passes either way between the fabric addresses (wait).
3. ``mtu``: the ends' MTUs differ, or one differs from ``[fabric] mtu``.
4. ``path_mtu``: a don't-fragment echo at the MTU is lost (or over a hop's MTU) while a small one passed —
   the MTU is proven, not assumed. Left out when rule 3 already explains it.
5. ``speed``: the ends' link speeds differ, or one is below ``[fabric] min_speed_mbps``.
6. ``gid_index``: ``NCCL_IB_GID_INDEX`` on either end is not the RoCE v2 GID of its fabric address.
7. ``master_port``: the worker cannot open a TCP connection to the master port over the fabric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd.preflight.dfping import Ping
from sparkd.preflight.gid import GidView
from sparkd.preflight.netdev import UNNAMED, Link
from sparkd.supervisor.failures import CAUSES, Cause, Failure, FailureClass

SMALL = 84  # the IP packet of a plain `ping`: 20 + 8 + 56


@dataclass(frozen=True)
class End:
    """One node's side of the fabric: its link, or why it has none; its GID view."""

    node: str
    link: Link | None
    problem: str | None = None
    gid: GidView | None = None

    @property
    def where(self) -> str:
        return f"{self.node}'s {self.link.interface}" if self.link else self.node

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "link": self.link.to_json() if self.link else None, "problem": self.problem,
                "gid": self.gid.to_json() if self.gid else None}

    @classmethod
    def from_json(cls, data: Any, fallback: str) -> End:
        data = data if isinstance(data, dict) else {}
        return cls(str(data.get("node") or fallback), Link.from_json(data.get("link")),
                   data.get("problem") if isinstance(data.get("problem"), str) else None,
                   GidView.from_json(data.get("gid")))


@dataclass(frozen=True)
class Probes:
    """The active part: echoes each way (small, then at the MTU) and the worker's connect to the master port."""

    out: Sequence[Ping] = ()  # head → worker
    back: Sequence[Ping] = ()  # worker → head
    master: str | None = None  # "open", "refused", "timed out", ...; None: not tried
    master_addr: str = ""


@dataclass(frozen=True)
class Expect:
    mtu: int | None = None
    min_speed_mbps: int | None = None


@dataclass(frozen=True)
class Finding:
    cause: Cause
    sentence: str


@dataclass
class Findings:
    items: list[Finding] = field(default_factory=list)

    def add(self, cause: Cause, sentence: str) -> None:
        self.items.append(Finding(cause, sentence))

    def has(self, cause: Cause) -> bool:
        return any(f.cause is cause for f in self.items)


def ping_size(head: End, expect: Expect) -> int:
    """The MTU the echoes prove: ``[fabric] mtu``, else the head's interface MTU, else 1500."""
    return expect.mtu or (head.link.mtu if head.link and head.link.mtu else 1500)


def _links(ends: Sequence[End], found: Findings) -> None:
    for end in ends:
        if end.link is None:
            found.add(Cause.link_down, f"{end.node}: {end.problem or 'no fabric interface'}")
        elif not end.link.up:
            found.add(Cause.link_down, f"the fabric interface {end.link.interface} on {end.node} is "
                      f"{end.link.state}")


def _mtu(head: Link, worker: Link, ends: Sequence[End], expect: Expect, found: Findings) -> None:
    want = expect.mtu or max(head.mtu or 0, worker.mtu or 0)
    fix = f" (set both to {want}, persistently in netplan or NetworkManager: a firmware reset or a reboot sets 1500)"
    if head.mtu != worker.mtu:
        found.add(Cause.mtu, f"the fabric MTU differs: {head.mtu} on {ends[0].where} but {worker.mtu} on "
                  f"{ends[1].where}" + (f" ([fabric] mtu is {expect.mtu})" if expect.mtu else "") + fix)
    elif expect.mtu is not None and head.mtu != expect.mtu:
        found.add(Cause.mtu, f"the fabric MTU is {head.mtu} on {ends[0].where} and {ends[1].where}, not "
                  f"[fabric] mtu = {expect.mtu}" + fix)


def _speed(ends: Sequence[End], expect: Expect, found: Findings) -> None:
    head, worker = (e.link for e in ends)
    assert head is not None and worker is not None
    if head.speed_mbps != worker.speed_mbps and None not in (head.speed_mbps, worker.speed_mbps):
        found.add(Cause.speed, f"the link speed differs: {head.speed_mbps} Mb/s on {ends[0].where} but "
                  f"{worker.speed_mbps} Mb/s on {ends[1].where} (a degraded link: reseat or replace the cable)")
    for end in ends:
        speed = end.link.speed_mbps if end.link else None
        if expect.min_speed_mbps and speed is not None and speed < expect.min_speed_mbps:
            found.add(Cause.speed, f"the link speed of {end.where} is {speed} Mb/s, below [fabric] "
                      f"min_speed_mbps = {expect.min_speed_mbps}")


def _echo(ping: Ping, sender: End, target: str) -> str:
    return f"a don't-fragment echo of {ping.size} bytes from {sender.where} to {target} ({ping.address}): {ping.error}"


def _probes(ends: Sequence[End], probes: Probes, found: Findings) -> None:
    directions = ((probes.out, ends[0], ends[1].node), (probes.back, ends[1], ends[0].node))
    small_lost = [(pings[0], sender, target) for pings, sender, target in directions if pings and not pings[0].ok]
    if len(small_lost) == sum(1 for pings, _, _ in directions if pings) and small_lost:
        ping, sender, target = small_lost[0]
        found.add(Cause.peer_unreachable, f"{target}'s fabric address {ping.address} answers no echo from "
                  f"{sender.where} ({ping.error})")
        return
    if found.has(Cause.mtu):
        return
    for pings, sender, target in directions:
        if len(pings) > 1 and pings[0].ok and not pings[1].ok:
            found.add(Cause.path_mtu, _echo(pings[1], sender, target) + f" while a {pings[0].size}-byte one "
                      f"passed: the path does not carry {pings[1].size}-byte packets (a switch port or a hop at a "
                      "lower MTU, or a firewall dropping them)")


def unchecked(ends: Sequence[End]) -> str | None:
    """Why the link cannot be checked at all (a config that names no fabric interface on an end), or None."""
    for end in ends:
        if end.link is None and end.problem == UNNAMED:
            return f"{end.node}: {UNNAMED}"
    return None


def findings(ends: Sequence[End], probes: Probes, expect: Expect) -> list[Finding]:
    """Every problem of the head–worker link ``ends`` (head first), in the order of the rules."""
    found = Findings()
    _links(ends, found)
    if found.items:
        return found.items
    head, worker = (e.link for e in ends)
    assert head is not None and worker is not None
    _mtu(head, worker, ends, expect, found)
    _probes(ends, probes, found)
    if found.has(Cause.peer_unreachable):
        return found.items
    _speed(ends, expect, found)
    for end in ends:
        if end.gid is not None and end.gid.problem:
            found.add(Cause.gid_index, f"on {end.node}: {end.gid.problem}")
    if probes.master not in (None, "open"):
        found.add(Cause.master_port, f"{ends[1].node} cannot connect to the master port {probes.master_addr} over "
                  f"the fabric ({probes.master}): a firewall on {ends[0].node} or a wrong [cluster] master_addr")
    return found.items


def failure(peer: str, found: Sequence[Finding]) -> Failure | None:
    """The refusal of a start for the link to ``peer``: the first finding's class, every finding's sentence."""
    if not found:
        return None
    cls = CAUSES[found[0].cause][0]
    then = ("sparkd waits for it and checks again" if cls is FailureClass.host_unavailable
            else "fix it; sparkd will not start the group until it holds")
    return Failure.of(cls, f"The fabric to the worker on {peer} is not ready: "
                      f"{'; '.join(f.sentence for f in found)}; {then}.")
