"""What both command-line programs share: loading the config with errors a person can act on, and the
checks of the files it names that only the host can answer."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from sparkd import exits
from sparkd.cli.locate import DEFAULT_CONFIG_PATH

if TYPE_CHECKING:  # imported when a command loads a config: --help and TAB completion need neither
    from sparkd.config import Config
    from sparkd.lint import Finding

EXIT_INVALID_CONFIG = exits.INVALID_CONFIG

config_option = click.option(
    "--config", "config_path", type=click.Path(path_type=Path), default=DEFAULT_CONFIG_PATH,
    show_default=True, help="The sparkd TOML config.",
)


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(code)


def config_or_exit(path: Path, *, profile: str | None = None, prog: str = "sparkd") -> Config:
    """Load the config or exit 2 with one line per problem, each naming its key (never a traceback)."""
    from sparkd.config import ConfigError, load_config

    try:
        return load_config(path, profile=profile)
    except ConfigError as exc:
        lines = [f"{prog}: invalid config {exc.source}:"] + [f"  {p}" for p in exc.problems]
        fail("\n".join(lines), EXIT_INVALID_CONFIG)


def token_file_findings(cfg: Config) -> list[Finding]:
    """Warnings about ``[api] token_file``: missing (the peer API then refuses every request), not a file, or
    readable by anyone but its owner (it is the pair's shared secret)."""
    from sparkd.lint import Finding, Level

    path = cfg.api.token_file
    if path is None:
        return []
    make = f"create it with the same secret on every node: (umask 077; openssl rand -hex 32 > {path})"
    try:
        st = path.stat()
    except FileNotFoundError:
        return [Finding("token-file-missing", Level.warning, "api.token_file",
                        f"{path} does not exist, so the peer API refuses every request; {make}")]
    except OSError as exc:
        return [Finding("token-file-unreadable", Level.warning, "api.token_file",
                        f"{path}: {exc.strerror or exc}")]
    if not stat.S_ISREG(st.st_mode):
        return [Finding("token-file-missing", Level.warning, "api.token_file", f"{path} is not a file; {make}")]
    if st.st_mode & 0o077:
        return [Finding("token-file-mode", Level.warning, "api.token_file",
                        f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")]
    return []
