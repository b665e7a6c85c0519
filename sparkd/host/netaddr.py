"""One spelling per IP address, so that the two ends of a connection name an address alike."""

from __future__ import annotations

import ipaddress


def normalise(address: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 as IPv4, IPv6 compressed; a non-address as given."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)
