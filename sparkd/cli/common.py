"""What both command-line programs share: loading the config with errors a person can act on, and the
checks of the files it names that only the host can answer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from sparkd.cli.locate import DEFAULT_CONFIG_PATH
from sparkd.host import exits

if TYPE_CHECKING:  # imported when a command loads a config: --help and TAB completion need neither
    from sparkd.config import Config
    from sparkd.launch.lint import Finding

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
    """Warnings about ``[api] token_file``, the same checks ``sparkd run`` refuses to start on: missing (the peer
    API then refuses every request), a symlink or not a file, owned by someone else, open to group or others (it
    is the pair's shared secret), or shorter than 32 bytes."""
    from sparkd.config.secretfile import SecretFileProblem, read_token
    from sparkd.launch.lint import Finding, Level

    path = cfg.api.token_file
    if path is None:
        return []
    try:
        read_token(path)
    except SecretFileProblem as exc:
        text = str(exc).removeprefix(f"[api] token_file {path} ")
        if "does not exist" in text:
            text = text.replace("does not exist;", "does not exist, so the peer API refuses every request;")
            return [Finding("token-file-missing", Level.warning, "api.token_file", f"{path} {text}")]
        return [Finding("token-file-unsafe", Level.warning, "api.token_file",
                        f"{path} {text}; sparkd run refuses to start with it")]
    return []


def host_file_findings(cfg: Config) -> list[Finding]:
    """What only the host can say about the files the config names: the token file, and a launch program that
    someone other than root may change (sparkd runs it as root)."""
    from sparkd.config.secretfile import SecretFileProblem, read_secret_file
    from sparkd.daemon.startup import launch_program_problem
    from sparkd.launch.lint import Finding, Level

    findings = token_file_findings(cfg)
    if cfg.launch.api_key_file is not None:
        try:
            read_secret_file(cfg.launch.api_key_file, "[launch] api_key_file")
        except SecretFileProblem as exc:
            text = str(exc).removeprefix("[launch] api_key_file ")
            findings.append(Finding("api-key-file-unsafe", Level.warning, "launch.api_key_file",
                                    f"{text}; sparkd run refuses to start with it"))
    program = launch_program_problem(cfg)
    if program is not None:
        key = "launch.script" if cfg.launch.script else "launch.executable"
        findings.append(Finding("launch-program-writable", Level.warning, key, program.split(" ", 2)[2]))
    return findings


def unit_findings(cfg: Config, config_path: Path) -> list[Finding]:
    """The systemd unit that runs ``config_path``, judged against the drained stop (``unit-stop-timeout-short``):
    nothing where systemd does not run or runs another config."""
    from sparkd.host.unit import unit_stop
    from sparkd.launch.stoplint import unit_rules

    return list(unit_rules(cfg, unit_stop(config_path)))
