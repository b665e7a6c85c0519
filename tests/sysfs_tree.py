"""A ``/sys`` of a test's own for RDMA devices (tests/conftest.py's ``sysfs`` fixture builds one)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


class SysfsTree:
    """A ``/sys`` of the test's own: ``<root>/class/infiniband/<hca>/ports/<n>/{state,link_layer,gids,gid_attrs}``
    as the kernel's ib_core lays it out (a GID slot not in use reads as zeros)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def port(self, hca: str, number: int = 1, *, state: str = "4: ACTIVE", link_layer: str = "Ethernet",
             gids: Mapping[int, tuple[str, str]] | None = None, ndev: str | None = None) -> Path:
        """``ndev``: the network interface every GID in use belongs to (``gid_attrs/ndevs/<i>``)."""
        base = self.root / "class" / "infiniband" / hca / "ports" / str(number)
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "state").write_text(state + "\n")
        (base / "link_layer").write_text(link_layer + "\n")
        for index in range(8):
            gid, kind = (gids or {}).get(index, ("0000:0000:0000:0000:0000:0000:0000:0000", ""))
            (base / "gids" / str(index)).write_text(gid + "\n")
            (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n" if kind else "")
            if ndev and kind:
                (base / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")
        return base


def roce_gid(ipv4: str) -> str:
    """The IPv4-mapped GID sysfs shows for ``ipv4`` (``0000:...:ffff:0a00:0001``)."""
    a, b, c, d = (int(x) for x in ipv4.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"




def netdev(root: Path, interface: str, *, operstate: str = "up", carrier: int = 1, speed: int = 200000,
           mtu: int = 9000) -> Path:
    """``<root>/class/net/<interface>`` as the kernel shows a link (a down link reads speed -1)."""
    base = root / "class" / "net" / interface
    base.mkdir(parents=True, exist_ok=True)
    for name, value in (("operstate", operstate), ("carrier", carrier), ("speed", speed), ("mtu", mtu)):
        (base / name).write_text(f"{value}\n")
    return base
