"""This node's fabric interface as the kernel shows it: which interface holds the fabric address, and its link
state, carrier, speed and MTU (``<sys>/class/net/<if>/{operstate,carrier,speed,mtu}``).

Read through ``sys_root`` so tests build their own tree; the address → interface lookup asks the kernel
(``getifaddrs`` through psutil) in the network namespace sparkd runs in.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from sparkd.preflight.base import read_text


@dataclass(frozen=True)
class Link:
    """One interface's link facts; None where the kernel gave no value (speed of a link that is down)."""

    interface: str
    exists: bool = True
    operstate: str | None = None  # up, down, lowerlayerdown, unknown, ...
    carrier: bool | None = None
    speed_mbps: int | None = None
    mtu: int | None = None
    address: str | None = None

    @property
    def up(self) -> bool:
        # A veth or a virtual link reads "unknown" while it carries traffic; the carrier decides then.
        return self.exists and self.carrier is not False and self.operstate in ("up", "unknown")

    @property
    def state(self) -> str:
        """``up``, ``down``, ``no carrier``, ``missing``: how a sentence names the link state."""
        if not self.exists:
            return "missing"
        if self.carrier is False and self.operstate != "down":
            return "no carrier"
        return self.operstate or "unknown"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Link | None:
        if not isinstance(data, dict) or not isinstance(data.get("interface"), str):
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def _int(text: str | None) -> int | None:
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if value >= 0 else None  # a down link reads speed -1 (or EINVAL)


def read_link(sys_root: Path, interface: str, address: str | None = None) -> Link:
    base = sys_root / "class" / "net" / interface
    if not base.exists():
        return Link(interface, exists=False, address=address)
    carrier = _int(read_text(base / "carrier"))
    return Link(interface, operstate=(read_text(base / "operstate") or "").strip() or None,
                carrier=None if carrier is None else bool(carrier), speed_mbps=_int(read_text(base / "speed")),
                mtu=_int(read_text(base / "mtu")), address=address)


def interface_of(address: str) -> str | None:
    """The interface holding ``address`` in this network namespace, or None."""
    try:
        table = psutil.net_if_addrs()
    except OSError:
        return None
    for name, addrs in table.items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6) and a.address.split("%")[0] == address:
                return name
    return None


UNNAMED = "no fabric interface named: set [fabric] interface or [node] address"


def fabric_link(sys_root: Path, interface: str | None, address: str | None) -> tuple[Link | None, str | None]:
    """(this node's fabric link, or None with the sentence saying why it cannot be named: ``UNNAMED`` when the
    config names neither an interface nor an address)."""
    if interface is None:
        if address is None:
            return None, UNNAMED
        interface = interface_of(address)
        if interface is None:
            return None, f"no interface holds the fabric address {address} ([node] address) on this node"
    return read_link(sys_root, interface, address), None
