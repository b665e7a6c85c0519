"""Clients waiting on vLLM's API port: the TCP connections open to it. I/O only.

vLLM's gauges freeze with a wedged engine, so they cannot say whether requests wait on it; the connections can.
uvicorn closes an idle keep-alive connection after 5 s, so an established connection to the port is, all but
briefly, a request in progress (or a stream). Read only where vLLM's port is the host's (the process runtime, host
networking); elsewhere the count is unknown (None).

Counted every health probe, so asked of the kernel the cheap way: one sock_diag dump (netlink) per address
family, filtered in the kernel to established sockets on the port. ``/proc/net/tcp{,6}`` is the fallback (a kernel
without ``inet_diag``): both tables cost ~5 ms of CPU a read where the established hash is large (262144 buckets
here, one to walk whatever the table holds), a quarter of the daemon's CPU at rest; the dump ~0.8 ms. The dump walks
the whole established hash too, whatever the filter (on a 16-core H100 host 3.7 ms of kernel time a dump, a third of
the daemon's CPU at rest with both families): only the families vLLM's listening socket can accept on are asked
(:func:`listen_families`).
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

__all__ = ["listen_families", "open_clients"]

BOTH = (socket.AF_INET, socket.AF_INET6)

_ESTABLISHED = "01"

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_ESTABLISHED = 1
_INET_DIAG_REQ_BYTECODE = 1
_INET_DIAG_BC_S_GE, _INET_DIAG_BC_S_LE = 2, 3
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_TIMEOUT_S = 2.0


def listen_families(host: str) -> tuple[int, ...]:
    """The address families of the connections vLLM's API socket accepts for ``--host``: an IPv4 address, or none
    (vLLM then binds IPv4's any address), takes IPv4 connections only; an IPv6 address IPv6 ones, and ``::`` both as
    IPv6 sockets (Linux's dual stack maps an IPv4 client into IPv6); a host name may resolve to either: both."""
    host = host.strip().strip("[]")
    for family in BOTH:
        try:
            socket.inet_pton(family, host or "0.0.0.0")
        except OSError:
            continue
        return (family,)
    return BOTH


def open_clients(port: int, proc_root: Path | None = None, families: tuple[int, ...] = BOTH) -> int | None:
    """Established connections whose local end is ``port`` (the server side of every client's connection), among
    the address ``families`` asked; None when they cannot be seen. ``proc_root``: read these tables instead of asking
    the kernel."""
    if proc_root is None:
        try:
            return sum(_diag_count(port, family) for family in families)
        except (OSError, struct.error):  # no inet_diag here, or an answer cut short: the tables say it
            proc_root = Path("/proc")
    return _table_count(port, proc_root)


def _diag_request(port: int, family: int) -> bytes:
    """A dump of ``family``'s established TCP sockets whose source port is ``port`` (sport ≥ port and ≤ port: each
    test jumps past the end, a rejection, when it fails)."""
    ops = (struct.pack("=BBH", _INET_DIAG_BC_S_GE, 8, 20) + struct.pack("=BBH", 0, 0, port)
           + struct.pack("=BBH", _INET_DIAG_BC_S_LE, 8, 12) + struct.pack("=BBH", 0, 0, port))
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_ESTABLISHED) + bytes(48)
    body = request + struct.pack("=HH", 4 + len(ops), _INET_DIAG_REQ_BYTECODE) + ops
    return _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + body


def _diag_count(port: int, family: int) -> int:
    """How many sockets the kernel's dump answers; OSError when it cannot be asked."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(_TIMEOUT_S)
        sock.sendto(_diag_request(port, family), (0, 0))
        count = 0
        while True:
            data = sock.recv(65536)
            if not data:
                raise OSError("the sock_diag dump ended without NLMSG_DONE")
            messages, done = count_messages(data)
            count += messages
            if done:
                return count


def count_messages(data: bytes) -> tuple[int, bool]:
    """The sockets in one read of a sock_diag dump, and whether the dump is done (NLMSG_DONE); OSError for an
    NLMSG_ERROR, with its errno."""
    count, offset = 0, 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if kind == _NLMSG_DONE:
            return count, True
        if kind == _NLMSG_ERROR:
            raise OSError(-struct.unpack_from("=i", data, offset + _HEADER.size)[0], "sock_diag refused")
        count += 1
        offset += max((length + 3) & ~3, _HEADER.size)
    return count, False


def _table_count(port: int, proc_root: Path) -> int | None:
    count, read = 0, False
    for table in ("tcp", "tcp6"):
        try:
            text = (proc_root / "net" / table).read_text()
        except OSError:
            continue
        read = True
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _ESTABLISHED:
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
            except (IndexError, ValueError):
                continue
    return count if read else None
