"""What both command-line programs share: loading the config with errors a person can act on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from sparkd import exits
from sparkd.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config

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
    try:
        return load_config(path, profile=profile)
    except ConfigError as exc:
        lines = [f"{prog}: invalid config {exc.source}:"] + [f"  {p}" for p in exc.problems]
        fail("\n".join(lines), EXIT_INVALID_CONFIG)
