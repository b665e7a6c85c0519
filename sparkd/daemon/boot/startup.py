"""What ``sparkd run`` checks before it builds the daemon: the files it trusts with root's power.

- The umask is 027: nothing sparkd creates is writable by its group or readable by others.
- The state, run and log directories, and every directory above them, can be changed by root (or the user sparkd
  runs as) only (:mod:`sparkd.host.trustedpaths`, sshd's StrictModes); else root could be made to write through a
  link or a FIFO someone planted there.
- ``[api] token_file`` is root's alone and long enough, ``[launch] api_key_file`` root's alone
  (:mod:`sparkd.config.secretfile`); the TLS files load.
- Those files, the TLS key (root's alone) and the unit's environment file, and every directory above them, can
  be changed by root only; a launch script or program on the host that someone else may change is refused unless
  ``[lint] allow`` says otherwise (then a logged warning) (:mod:`sparkd.host.rootfiles`). The config file itself
  is checked before it is read (``sparkd run``) and on every reload.

Each problem is one sentence and an exit status the unit does not restart on (``sparkd.host.exits``).
"""

from __future__ import annotations

import ctypes
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparkd.cluster.tls import TlsProblem, server_context
from sparkd.config import Config
from sparkd.config.secretfile import SecretFileProblem, read_secret_file, read_token
from sparkd.host import exits
from sparkd.host.rootfiles import launch_program_refusal, trusted_files_problem
from sparkd.host.trustedpaths import first_unsafe
from sparkd.launch.redact import read_secret

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

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
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def unchecked(cls, cfg: Config) -> Trusted:
        """For a daemon built in-process (tests): the token file read as it is, no TLS."""
        return cls(read_secret(cfg.api.token_file), None)


def directories(cfg: Config) -> list[tuple[str, Path]]:
    """The directories sparkd writes in, each with the key that names it."""
    paths = cfg.paths
    logs = "[paths] log_dir" if paths.log_dir is not None else "[paths] log_dir (by default <state_dir>/logs)"
    return [("[paths] state_dir", paths.state_dir), ("[paths] run_dir", paths.run_dir), (logs, paths.logs),
            ("the incidents folder", paths.incidents), ("the process runtime's folder", paths.state_dir / "run")]


M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2  # malloc arenas for every thread the daemon or a library (NVML) starts, however many cores the host has


def bound_malloc_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """At most :data:`ARENAS` malloc arenas (glibc makes up to 8 per core, one per thread that allocates, each
    keeping what it once held): the daemon's few threads share them, so its memory at rest does not grow with the
    host's cores. ``MALLOC_ARENA_MAX`` in the environment (an operator's choice) wins; no glibc, nothing done.
    Called before the daemon starts a thread."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(ARENAS)))


def prepare_or_status(cfg: Config, log: Logger) -> Trusted | int:
    """:func:`prepare`, its warnings logged; a problem is logged and its exit status returned instead."""
    try:
        trusted = prepare(cfg)
    except StartupProblem as exc:
        log.error("startup_failed", detail=str(exc))
        return exc.status
    for warning in trusted.warnings:
        log.warning("launch_program_writable", detail=warning)
    return trusted


def prepare(cfg: Config) -> Trusted:
    """Set the umask and check the directories, the secret and TLS files. Raises :class:`StartupProblem`."""
    os.umask(UMASK)
    why = first_unsafe(directories(cfg))
    if why is not None:
        raise StartupProblem(why, exits.HOST_PROBLEM)
    try:
        token = read_token(cfg.api.token_file)
        if cfg.launch.api_key_file is not None:
            read_secret_file(cfg.launch.api_key_file, "[launch] api_key_file")
    except SecretFileProblem as exc:
        raise StartupProblem(f"{exc}; sparkd does not start with it", exits.INVALID_CONFIG) from None
    why = trusted_files_problem(cfg)
    if why is not None:
        raise StartupProblem(why, exits.HOST_PROBLEM)
    try:
        tls = server_context(cfg.api)
    except TlsProblem as exc:
        raise StartupProblem(str(exc), exits.INVALID_CONFIG) from None
    refusal, overridden = launch_program_refusal(cfg)
    if refusal is not None:
        raise StartupProblem(refusal, exits.INVALID_CONFIG)
    return Trusted(token, tls, [overridden] if overridden else [])
