"""Mutual TLS for the peer link (``[api] tls_cert``, ``tls_key``, ``tls_ca``): the contexts of both ends.

The server asks every client for a certificate but lets one without a certificate finish the handshake
(``CERT_OPTIONAL``): Prometheus scrapes ``/metrics`` without one, and the peer API refuses a connection that
did not present a certificate chaining to ``tls_ca`` (``sparkd.api.gates``); a connection from a peer's address
without one is closed at once, and one with one has proved itself (``sparkd.api.bounded``). A client certificate
that does not chain to the CA fails the handshake. The client checks the server's certificate against the CA and
the address it dialled (the certificate's subjectAltName must hold the peer's address as written in ``[cluster]
peers``).
The private key is read only when it is root's (or the running user's) alone and not a symlink, as the token file.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from sparkd.config import ApiConfig
from sparkd.config.secretfile import SecretFileProblem, read_secret_file


class TlsProblem(Exception):
    """A sentence naming the key and the file that keeps TLS from being set up."""


def _load(context: ssl.SSLContext, api: ApiConfig) -> ssl.SSLContext:
    assert api.tls_cert is not None and api.tls_key is not None and api.tls_ca is not None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for key, path in (("tls_cert", api.tls_cert), ("tls_key", api.tls_key), ("tls_ca", api.tls_ca)):
        if not Path(path).is_file():
            raise TlsProblem(f"[api] {key} {path} is not a readable file")
    try:  # the private key as the token file: root's alone, no symlink (review 2, #26)
        read_secret_file(Path(api.tls_key), "[api] tls_key")
    except SecretFileProblem as exc:
        raise TlsProblem(f"{exc}; it is this node's private key") from None
    try:
        context.load_cert_chain(str(api.tls_cert), str(api.tls_key))
    except (OSError, ssl.SSLError) as exc:
        raise TlsProblem(f"[api] tls_cert {api.tls_cert} with tls_key {api.tls_key} cannot be loaded: "
                         f"{getattr(exc, 'reason', None) or exc}") from None
    try:
        context.load_verify_locations(cafile=str(api.tls_ca))
    except (OSError, ssl.SSLError) as exc:
        raise TlsProblem(f"[api] tls_ca {api.tls_ca} cannot be loaded: {getattr(exc, 'reason', None) or exc}"
                         ) from None
    return context


def server_context(api: ApiConfig) -> ssl.SSLContext | None:
    """The listener's context, or None without TLS. Raises :class:`TlsProblem`."""
    if not api.tls:
        return None
    context = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), api)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(api: ApiConfig) -> ssl.SSLContext | None:
    """The peer client's context (it presents this node's certificate), or None without TLS."""
    if not api.tls:
        return None
    context = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), api)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context
