"""Active probes of the fabric path: a don't-fragment ICMP echo of a given size, and a TCP connect.

The echo is sent from a raw ICMP socket with ``IP_MTU_DISCOVER = IP_PMTUDISC_DO`` (the kernel sets DF and never
fragments: a packet over the local MTU fails with EMSGSIZE, one over a hop's MTU is dropped or answered with
"fragmentation needed"), so a reply proves the path carries packets of that size. Linux's default
(``IP_PMTUDISC_WANT``) sets DF too, but once a hop has said "fragmentation needed" it fragments locally for ten
minutes, and the next start's echo would pass in pieces. ``size`` is the whole IP
packet (the MTU under test): 20 bytes of IP header, 8 of ICMP, the rest payload — what ``ping -M do -s
<size-28>`` sends. Without the privilege for a raw socket, ``ping -M do`` is used when installed; the result
says which. IPv4 only (an IPv6 path never fragments in transit; its MTU is the interfaces' and is compared).
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IP_MTU = getattr(socket, "IP_MTU", 14)
ECHO_REQUEST, ECHO_REPLY, UNREACHABLE, FRAG_NEEDED = 8, 0, 3, 4
RAW = "raw ICMP socket with IP_PMTUDISC_DO"
PING = "ping -M do"


@dataclass(frozen=True)
class Ping:
    address: str
    size: int  # the IP packet's size in bytes: the MTU under test
    ok: bool
    rtt_ms: float | None = None
    error: str | None = None
    method: str = RAW

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Ping | None:
        if not isinstance(data, dict) or not isinstance(data.get("address"), str):
            return None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_packet(ident: int, seq: int, payload: bytes) -> bytes:
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + payload), ident, seq) + payload


def read_reply(packet: bytes, source: str, address: str, ident: int) -> tuple[str, int | None] | None:
    """What an ICMP packet (with its IP header) says about our echo: ("reply", None), ("frag", next-hop MTU),
    or None when it is not about us."""
    if len(packet) < 20:
        return None
    ihl = (packet[0] & 0x0F) * 4
    icmp = packet[ihl:]
    if len(icmp) < 8:
        return None
    kind, code = icmp[0], icmp[1]
    if kind == ECHO_REPLY and source == address and struct.unpack("!H", icmp[4:6])[0] == ident:
        return "reply", None
    if kind == UNREACHABLE and code == FRAG_NEEDED and len(icmp) >= 8 + 20 + 8:
        inner = icmp[8:]
        inner_icmp = inner[(inner[0] & 0x0F) * 4:]
        if socket.inet_ntoa(inner[16:20]) == address and struct.unpack("!H", inner_icmp[4:6])[0] == ident:
            return "frag", struct.unpack("!H", icmp[6:8])[0]
    return None


def _known_mtu(sock: socket.socket, address: str) -> str:
    """``: 1500``, the path MTU the kernel holds for ``address`` (its interface's, or one a hop reported)."""
    try:
        sock.connect((address, 0))
        return f": {sock.getsockopt(socket.IPPROTO_IP, IP_MTU)}"
    except OSError:
        return ""


def _raw_ping(address: str, size: int, timeout_s: float, tries: int) -> Ping:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        ident = (os.getpid() ^ int(time.monotonic_ns())) & 0xFFFF
        payload = bytes(range(256)) * (max(size - 28, 0) // 256 + 1)
        per_try = timeout_s / max(tries, 1)
        for seq in range(1, tries + 1):
            sent = time.monotonic()
            try:
                sock.sendto(echo_packet(ident, seq, payload[: max(size - 28, 0)]), (address, 0))
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:
                    return Ping(address, size, False, error=f"{size} bytes is over the path MTU this node knows "
                                f"to {address}{_known_mtu(sock, address)} (EMSGSIZE)")
                return Ping(address, size, False, error=f"cannot send: {exc.strerror or exc}")
            deadline = sent + per_try
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    break
                packet, (source, _) = sock.recvfrom(65535)
                seen = read_reply(packet, source, address, ident)
                if seen is None:
                    continue
                if seen[0] == "frag":
                    return Ping(address, size, False, error=f"a hop needs fragmentation: its MTU is {seen[1]}")
                return Ping(address, size, True, rtt_ms=round((time.monotonic() - sent) * 1000, 3))
        return Ping(address, size, False, error=f"no reply within {timeout_s:g} s ({tries} tries)")
    finally:
        sock.close()


def _ping_command(address: str, size: int, timeout_s: float, tries: int) -> Ping:
    program = shutil.which("ping")
    if program is None:
        return Ping(address, size, False, error="no raw socket allowed and no ping installed", method=PING)
    argv = [program, "-n", "-q", "-M", "do", "-s", str(max(size - 28, 0)), "-c", str(tries),
            "-i", "0.2", "-W", f"{max(timeout_s / tries, 0.2):g}", address]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 2)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Ping(address, size, False, error=str(exc), method=PING)
    if done.returncode == 0:
        return Ping(address, size, True, method=PING)
    text = (done.stdout + done.stderr).strip().splitlines()
    return Ping(address, size, False, error=(text[-1] if text else f"exit {done.returncode}"), method=PING)


def df_ping(address: str, size: int, timeout_s: float = 1.0, tries: int = 3) -> Ping:
    """One don't-fragment echo of ``size`` bytes answered within ``timeout_s`` (blocking: run it in a thread)."""
    if ":" in address:
        return Ping(address, size, False, error="IPv6: not pinged")
    try:
        return _raw_ping(address, size, timeout_s, tries)
    except PermissionError:
        return _ping_command(address, size, timeout_s, tries)
    except OSError as exc:
        return Ping(address, size, False, error=f"cannot ping: {exc.strerror or exc}")


def tcp_reach(host: str, port: int, timeout_s: float = 1.0) -> str:
    """``open`` (something listens and took the connection), ``refused``, ``timed out`` or the error."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timed out"
    except OSError as exc:
        return exc.strerror or str(exc)


def listen_once(host: str, port: int) -> socket.socket | None:
    """A listener on ``host:port`` for the peers' connect test, or None when the port is taken (or not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(16)
    except OSError:
        sock.close()
        return None
    return sock
