"""Signed requests between the daemons of a group: HMAC-SHA256 with the shared secret of ``[api] token_file``.
Pure: the time is passed in.

The secret never crosses the network (a bearer token did: a passive tap saw it within one poll). Each request
carries ``Authorization: Sparkd-HMAC-SHA256 t=<unix time>,n=<nonce>,f=<sender's node name>,s=<signature>``, the
signature being HMAC-SHA256(secret, ``sparkd-peer-v2`` LF method LF path?query LF t LF n LF Content-Type LF sender's
node name LF sender's address LF recipient's address:port LF sha256(body)). The addresses are those of the very
connection: the sender's source address and the address and port it connected to, as the receiver sees them
(a request the head signed for the worker is worth nothing at the head, review 2 #6; nothing between the nodes
may rewrite addresses: no NAT on the peer link). The receiver:

1. refuses a request whose time is more than :data:`WINDOW_S` from its own clock (the nodes' clocks must agree:
   chrony/NTP), so a captured request is worth nothing after the window;
2. refuses a request signed with its own node name (a reflection);
3. recomputes the signature (constant-time compare) over what it received, its Content-Type (review 2 #5: a
   signed failure report could be stripped to nothing by changing it) and the connection's two ends;
4. refuses a nonce it has already accepted within the window (:class:`ReplayCache`), so a captured request is
   worth nothing inside the window either.

The answer is not signed: against someone who can alter traffic on the fabric, not only read it, run the link
with mutual TLS (``[api] tls_cert``/``tls_key``/``tls_ca``; docs/design.md, the threat model).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote, unquote

SCHEME = "Sparkd-HMAC-SHA256"
WINDOW_S = 30.0
MAX_NONCES = 100_000  # far above what peers send in a window (a poll every 2 s); full: refuse, never forget early
_HEADER = re.compile(rf"^{SCHEME} t=(\d{{1,12}}(?:\.\d{{1,6}})?),n=([0-9a-f]{{32}}),f=([A-Za-z0-9%._~-]{{1,400}}),"
                     r"s=([0-9a-f]{64})$")


@dataclass(frozen=True)
class Ends:
    """Who sends a request to whom: the sender's node name and the connection's two ends."""

    sender: str  # the sender's [node] name
    source: str  # the sender's address (the connection's source)
    recipient: str  # "address:port" the connection goes to


def _message(method: str, target: str, when: str, nonce: str, body: bytes, content_type: str, ends: Ends) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(("sparkd-peer-v2", method.upper(), target, when, nonce, content_type, ends.sender,
                      ends.source, ends.recipient, digest)).encode()


def sign(secret: str, method: str, target: str, body: bytes, *, now: float, ends: Ends, content_type: str = "",
         nonce: str | None = None) -> str:
    """The ``Authorization`` header value for a request (``target``: the path with its query string)."""
    when = f"{now:.3f}"
    nonce = nonce or secrets.token_hex(16)
    mac = hmac.new(secret.encode(), _message(method, target, when, nonce, body, content_type, ends),
                   hashlib.sha256).hexdigest()
    return f"{SCHEME} t={when},n={nonce},f={quote(ends.sender, safe='')},s={mac}"


class Refused(Exception):
    """Why a request's signature is not accepted: a sentence for the 401 answer and the log."""


@dataclass(frozen=True)
class Signed:
    when: float
    stamp: str  # the time as sent: what was signed
    nonce: str
    sender: str  # the sender's node name
    mac: str


def parse(header: str) -> Signed:
    match = _HEADER.match(header.strip())
    if match is None:
        raise Refused(f"the request is not signed (an Authorization header '{SCHEME} t=…,n=…,f=…,s=…' made with "
                      "the peers' shared secret is required)")
    return Signed(float(match.group(1)), match.group(1), match.group(2), unquote(match.group(3)), match.group(4))


class ReplayCache:
    """The nonces accepted within the window, oldest first; each is forgotten once its request has expired."""

    def __init__(self, window_s: float = WINDOW_S, capacity: int = MAX_NONCES) -> None:
        self.window_s = window_s
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it expires

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, nonce: str, *, when: float, now: float) -> str | None:
        """None when ``nonce`` is new (it is remembered until ``when`` + window); else why it is refused."""
        while self._seen:
            oldest, expires = next(iter(self._seen.items()))
            if expires > now:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            return "the request was replayed (its nonce was already used)"
        if len(self._seen) >= self.capacity:
            return "too many signed requests within the window; try again shortly"
        self._seen[nonce] = max(when, now) + self.window_s
        self._seen.move_to_end(nonce)
        return None


def verify(secret: str, header: str, method: str, target: str, body: bytes, *, now: float,
           replays: ReplayCache, source: str, recipient: str, content_type: str = "", node: str | None = None,
           window_s: float = WINDOW_S) -> None:
    """Raise :class:`Refused` (with the reason) unless the request is signed with ``secret`` by another node than
    ``node`` (this one), from ``source`` to ``recipient`` (the connection's ends), fresh and new."""
    signed = parse(header)
    if node is not None and signed.sender == node:
        raise Refused(f"the request is signed by this node ({node}) itself: a request sent back to its sender")
    off = signed.when - now
    if abs(off) > window_s:
        side = "ahead of" if off > 0 else "behind"
        raise Refused(f"the request's time is {abs(off):.0f} s {side} this node's clock (at most {window_s:.0f} s "
                      "is accepted): synchronise the nodes' clocks (chrony/NTP), or it is a replay")
    ends = Ends(signed.sender, source, recipient)
    expected = hmac.new(secret.encode(), _message(method, target, signed.stamp, signed.nonce, body, content_type,
                                                  ends), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signed.mac):
        raise Refused("the request's signature does not match: the nodes' [api] token_file secrets differ, or the "
                      f"request was altered, or it was not sent from {source} to {recipient} (a request is signed "
                      "for one connection's two ends: no NAT on the peer link)")
    why = replays.admit(signed.nonce, when=signed.when, now=now)
    if why is not None:
        raise Refused(why)
