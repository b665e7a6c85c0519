"""What ``sparkd run`` checks before it builds the daemon: the files it trusts with root's power.

- The umask is 027: nothing sparkd creates is writable by its group or readable by others.
- ``[api] token_file`` is root's alone and long enough (:mod:`sparkd.secretfile`); the TLS files load.

Each problem is one sentence and an exit status the unit does not restart on (``sparkd.exits``).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from sparkd import exits
from sparkd.cluster.tls import TlsProblem, server_context
from sparkd.config import Config
from sparkd.secretfile import SecretFileProblem, read_token

UMASK = 0o027


class StartupProblem(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Trusted:
    """What the checks produced: the peers' secret and the TCP port's TLS context."""

    token: str | None
    tls: ssl.SSLContext | None


def prepare(cfg: Config) -> Trusted:
    """Set the umask and check the secret and TLS files. Raises :class:`StartupProblem`."""
    os.umask(UMASK)
    try:
        token = read_token(cfg.api.token_file)
    except SecretFileProblem as exc:
        raise StartupProblem(f"{exc}; sparkd does not start with it", exits.INVALID_CONFIG) from None
    try:
        tls = server_context(cfg.api)
    except TlsProblem as exc:
        raise StartupProblem(str(exc), exits.INVALID_CONFIG) from None
    return Trusted(token, tls)
