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
DAEMON_UMASK = 0o027  # the daemon's (sparkd.daemon.boot.startup): folders and files the programs create get its modes

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


def host_file_findings(cfg: Config, config_path: Path | None = None) -> list[Finding]:
    """What only the host can say about the files the config names: the config file itself, the token file, the
    TLS files, the unit's environment file, and a launch program that someone other than root may change (sparkd
    runs it as root: an error unless ``[lint] allow`` lists its rule)."""
    from sparkd.cluster.tls import TlsProblem, server_context
    from sparkd.config.secretfile import SecretFileProblem, read_secret_file
    from sparkd.host.rootfiles import PROGRAM_OVERRIDE, config_problem, launch_program_problem
    from sparkd.launch.lint import Finding, Level

    findings = token_file_findings(cfg)
    if cfg.launch.api_key_file is not None:
        try:
            read_secret_file(cfg.launch.api_key_file, "[launch] api_key_file")
        except SecretFileProblem as exc:
            text = str(exc).removeprefix("[launch] api_key_file ")
            findings.append(Finding("api-key-file-unsafe", Level.warning, "launch.api_key_file",
                                    f"{text}; sparkd run refuses to start with it"))
    untrusted = config_problem(config_path, cfg) if config_path is not None else None
    if untrusted is not None:
        findings.append(Finding("root-file-unsafe", Level.warning, "(file)",
                                f"{untrusted}; sparkd run refuses to start with it"))
    try:
        server_context(cfg.api)
    except TlsProblem as exc:
        findings.append(Finding("tls-unusable", Level.warning, "api.tls", f"{exc}; sparkd run refuses to start "
                                "with it"))
    findings += probe_version_findings(cfg)
    program = launch_program_problem(cfg)
    if program is not None:
        key = "launch.script" if cfg.launch.script else "launch.executable"
        level = Level.warning if PROGRAM_OVERRIDE in cfg.lint.allow else Level.error
        findings.append(Finding(PROGRAM_OVERRIDE, level, key, program.split(" ", 2)[2]))
    return findings


def daemon_environment(cfg: Config, config_path: Path) -> dict[str, str] | None:
    """The environment of the ``sparkd run`` serving ``config_path`` (its PID from the state directory's
    ``status.json``, proven by its command line), when this user may read it: what its vLLM inherits on the host.
    None when no such daemon runs or its environment cannot be read."""
    from sparkd.state.files import read_json

    pid = (read_json(cfg.paths.state_dir / "status.json") or {}).get("daemon_pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return None
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if not any(Path(w).name == "sparkd" for w in words) or "run" not in words:
            return None
        named = words[words.index("--config") + 1] if "--config" in words[:-1] else str(DEFAULT_CONFIG_PATH)
        if Path(named).resolve() != config_path.resolve():
            return None
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if b"=" in item)
    return {name: value for name, _, value in pairs}


def node_lint(cfg: Config, config_path: Path) -> list[Finding]:
    """The lint as the daemon judges this node's launch: in the environment it gives vLLM (on the host, the running
    daemon's own when it can be read, else this command's) and by the starts this node measured."""
    import os

    from sparkd.launch.lint import lint
    from sparkd.launch.traps import NodeFacts
    from sparkd.state.starttimes import measured_starts

    host_env = daemon_environment(cfg, config_path) if not cfg.runtime.in_container else None
    node = NodeFacts(cold_starts_s=measured_starts(cfg.paths.state_dir))
    return lint(cfg, host_env=os.environ if host_env is None else host_env, node=node)


def probe_version_findings(cfg: Config) -> list[Finding]:
    """The step probe against the vLLM the last preflight found on this node (its argv check prints vLLM's version,
    kept in ``<state_dir>/vllm-args.json``): a warning when that vLLM is too old to load the probe."""
    from sparkd.launch.lint import probe_rules
    from sparkd.launch.probe import parse_version
    from sparkd.state.files import read_json

    entries = read_json(cfg.paths.state_dir / "vllm-args.json") or {}
    found = [e.get("found", "") for e in entries.values() if isinstance(e, dict) and e.get("verdict") == "ok"]
    versions = [parse_version(text.split()[1]) for text in found if text.startswith("vllm ") and len(text.split()) > 1]
    known = [v for v in versions if v is not None]
    if not known:
        return []
    where = f"the vLLM the last preflight found, {cfg.paths.state_dir / 'vllm-args.json'}"
    return list(probe_rules(cfg, known[-1], where))


def unit_findings(cfg: Config, config_path: Path) -> list[Finding]:
    """The systemd unit that runs ``config_path``, judged against the drained stop (``unit-stop-timeout-short``):
    nothing where systemd does not run or runs another config."""
    from sparkd.host.unit import unit_stop
    from sparkd.launch.stoplint import unit_rules

    return list(unit_rules(cfg, unit_stop(config_path)))
