"""What root trusts, checked like sshd's StrictModes at startup and on every reload: the config file and every
directory above it, the unit's environment file, the token file, the TLS files, ``api_key_file`` — and the
launch program root runs.

A config owned by ``nobody`` in a ``nobody``-owned directory passed ``check-config`` and ``sparkd run`` ran
nobody's script as root; a TLS key owned by another user, mode 0644, was taken (security review 2, #26, #27).
Whoever can change any of these chooses what root runs, or holds the node's key. Each refusal is one sentence
naming the path, its owner and its mode (:func:`sparkd.host.trustedpaths.unsafe`). A launch program another user
may change is refused unless ``[lint] allow`` lists :data:`PROGRAM_OVERRIDE` (then it is a logged warning).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from sparkd.config import Config
from sparkd.host.trustedpaths import unsafe
from sparkd.launch.program import which

ENVIRONMENT_FILE = Path("/etc/default/sparkd")  # the unit's EnvironmentFile=
ENVIRONMENT_FILES_VAR = "SPARKD_ENVIRONMENT_FILES"  # more of them (a drop-in's EnvironmentFile=), ':'-separated
PROGRAM_OVERRIDE = "launch-program-writable"


def _runner() -> str:
    return "root" if os.geteuid() == 0 else "this user"


def file_problem(key: str, path: Path) -> str | None:
    """Why someone other than root (or the user sparkd runs as) could change ``path`` or a directory above it."""
    why = unsafe(path)
    if why is None:
        return None
    return (f"{key} {path} is refused: {why}; sparkd runs as {_runner()} and takes what this file says, so only "
            f"{_runner()} may change it and every directory above it (sshd's StrictModes): chown root, chmod go-w")


def environment_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    environ = os.environ if environ is None else environ
    extra = [Path(p) for p in environ.get(ENVIRONMENT_FILES_VAR, "").split(":") if p.strip()]
    return [ENVIRONMENT_FILE, *extra]


def _named_files(cfg: Config, environ: Mapping[str, str] | None) -> Iterator[tuple[str, Path]]:
    for path in environment_files(environ):
        yield "the environment file", path
    api = cfg.api
    named: list[tuple[str, Path | None]] = [
        ("[api] token_file", api.token_file), ("[launch] api_key_file", cfg.launch.api_key_file),
        ("[api] tls_cert", api.tls_cert), ("[api] tls_key", api.tls_key), ("[api] tls_ca", api.tls_ca)]
    for key, given in named:
        if given is not None:
            yield key, Path(given)


def trusted_files_problem(cfg: Config, environ: Mapping[str, str] | None = None) -> str | None:
    """The first of the files the config names (and the unit's environment files) that someone else could change
    (the secrets' own owner and mode: :mod:`sparkd.config.secretfile`, :mod:`sparkd.cluster.tls`); None when all
    are sound. Missing files are another check's to name."""
    for key, path in _named_files(cfg, environ):
        why = file_problem(key, path)
        if why is not None:
            return why
    return None


def config_problem(path: Path, cfg: Config | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The config file, then (given the config it holds) the files it names."""
    why = file_problem("the config", path)
    if why is not None or cfg is None:
        return why
    return trusted_files_problem(cfg, environ)


def launch_program_problem(cfg: Config) -> str | None:
    """Why the program root runs on the host (``[launch] script``, else ``executable``) could be changed by
    someone else, or None (docker runtimes run it in the container; a program not found is preflight's to say)."""
    if cfg.runtime.in_container:
        return None
    key, name = ("[launch] script", cfg.launch.script) if cfg.launch.script else \
        ("[launch] executable", cfg.launch.executable)
    found = name if "/" in name else which(name)
    if found is None:
        return None
    why = unsafe(found)
    if why is None:
        return None
    return (f"{key} {found} is run by sparkd as {_runner()}, but {why}: whoever can change it runs code as sparkd; "
            f"make it and its directories writable by root only, or list {PROGRAM_OVERRIDE!r} in [lint] allow to "
            "run it anyway")


def launch_program_refusal(cfg: Config) -> tuple[str | None, str | None]:
    """(the refusal, or None; the warning to log when ``[lint] allow`` overrides it, or None)."""
    why = launch_program_problem(cfg)
    if why is None:
        return None, None
    if PROGRAM_OVERRIDE in cfg.lint.allow:
        return None, f"{why} (run anyway: [lint] allow lists {PROGRAM_OVERRIDE!r})"
    return why, None
