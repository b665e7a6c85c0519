"""``sparkd``: the daemon and its one-shot commands.

The config, the launch renderer, the linter and the rest are imported by the command that uses them: ``--help``
and a TAB completion (``sparkd check-config --profile <TAB>``) need click alone, and answer in a fraction of the
~0.3 s that importing the config's models costs (issue 28; tests/bench/bench_cli.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sparkd import __version__
from sparkd.cli.common import (
    DAEMON_UMASK,
    EXIT_INVALID_CONFIG,
    config_option,
    config_or_exit,
    fail,
    host_file_findings,
    node_lint,
    unit_findings,
)
from sparkd.cli.complete import profile_names

if TYPE_CHECKING:
    from sparkd.config import Config


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkd")
def main() -> None:
    """sparkd supervises vLLM on one node: preflight, launch, health, memory guard, restarts."""
    os.umask(DAEMON_UMASK)  # what a command creates (a state folder, a file) has the daemon's modes


def linted_config_or_exit(config_path: Path, *, profile: str | None = None, as_node: bool = False,
                          unit: bool = False) -> Config:
    """The config, its lint findings printed; exit 2 when it is invalid or has a lint error. ``as_node``: judged as
    the daemon judges this node's launch (:func:`node_lint`: the daemon's environment, the measured starts);
    ``unit``: also judge the systemd unit that runs this config (check-config)."""
    from sparkd.launch.lint import errors, lint

    cfg = config_or_exit(config_path, profile=profile)
    findings = [*(node_lint(cfg, config_path) if as_node else lint(cfg)), *host_file_findings(cfg, config_path),
                *(unit_findings(cfg, config_path) if unit else ())]
    for finding in findings:
        click.echo(f"{config_path}: {finding}", err=True)
    if errors(findings):
        fail(f"sparkd: {config_path}: invalid ({len(errors(findings))} error(s))", EXIT_INVALID_CONFIG)
    return cfg


@main.command("check-config", epilog=(
    "Exit status: "
    "0 valid (warnings printed); 2 invalid (each problem names its key or variable)."))
@config_option
@click.option("--profile", default=None, shell_complete=profile_names,
              help="Apply this launch profile instead of the config's own.")
@click.option("--json", "as_json", is_flag=True, help='Print {"valid": ..., "problems": [...], "findings": [...]} '
              "on stdout (for CI), with the same exit status.")
def check_config(config_path: Path, profile: str | None, as_json: bool) -> None:
    """Validate the config and lint it against known-bad settings. Exit 0 valid, 2 invalid."""
    if as_json:
        from sparkd.cli.checkjson import check_config_json

        report = check_config_json(config_path, profile)
        click.echo(json.dumps(report, indent=2))
        sys.exit(0 if report["valid"] else EXIT_INVALID_CONFIG)
    cfg = linted_config_or_exit(config_path, profile=profile, as_node=True, unit=True)
    click.echo(f"{config_path}: ok (node {cfg.node.name}, role {cfg.node.role.value}, runtime "
               f"{cfg.runtime.value}, launch hash {cfg.launch_hash()})")


@main.command("render", epilog="Exit status: 0 rendered; 2 a config check-config refuses (nothing printed on stdout).")
@config_option
@click.option("--json", "as_json", is_flag=True, help='Print {"argv": [...], "env": {...}} instead.')
def render_cmd(config_path: Path, as_json: bool) -> None:
    """Print the launch script (or argv and env) rendered from the config; exit 2, printing nothing, for a config
    check-config refuses."""
    from sparkd.launch.render import render, render_script

    cfg = linted_config_or_exit(config_path)
    spec = render(cfg)
    if as_json:
        click.echo(json.dumps(spec.to_json(), indent=2))
    else:
        click.echo(render_script(spec, source=str(config_path)), nl=False)


@main.command("config-reference", epilog="Exit status: 0.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key instead of markdown.")
def config_reference_cmd(as_json: bool) -> None:
    """Every config key: type, default, environment variable, description (docs/config.md is this output)."""
    from dataclasses import asdict

    from sparkd.config.reference import reference_markdown, rows
    from sparkd.launch.traps import rules_markdown

    if as_json:
        click.echo(json.dumps([asdict(row) for row in rows()], indent=2))
    else:
        click.echo(reference_markdown() + rules_markdown(), nl=False)


@main.command("run", epilog=(
    "Exit status: "
    "0 stopped cleanly (or handed over); 1 a failure systemd may restart; 2 an invalid config; 3 a "
    "host problem (a port taken, a directory not writable); 4 another sparkd runs on this node."))
@config_option
@click.option("--rehearse", is_flag=True, help="Run the config with the vLLM stand-in in place of vLLM.")
def run_cmd(config_path: Path, rehearse: bool) -> None:
    """Run the daemon in the foreground."""
    # The daemon draws nothing on a terminal: rich (sparkctl's live progress line) stays out of it. structlog
    # imports rich whenever it is installed, for its console tracebacks: 3 MiB and 66 modules at rest.
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
    from sparkd.daemon.app import run_daemon
    from sparkd.host import exits
    from sparkd.host.rootfiles import config_problem

    untrusted = config_problem(config_path)  # before a word of it is read: it says what root runs
    if untrusted is not None:
        fail(f"sparkd: {untrusted}; sparkd does not start with it", exits.HOST_PROBLEM)
    cfg = linted_config_or_exit(config_path)
    raise SystemExit(run_daemon(cfg, config_path=config_path, rehearse=rehearse))


@main.command("preflight", epilog="Exit status: 0 ready to launch; 1 a check failed; 2 an invalid config.")
@config_option
@click.option("--dry-run", is_flag=True, help="Report what would be fixed; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--check", "only", multiple=True, metavar="ID",
              help="Run only this check (repeatable), e.g. --check ports.")
@click.option("--quiet", is_flag=True, help="Print nothing when ready; when not, only the one line saying why.")
def preflight_cmd(config_path: Path, dry_run: bool, as_json: bool, only: tuple[str, ...], quiet: bool) -> None:
    """Check (and clean) the node before a launch. Exit 0 ready to launch, 1 a check failed, 2 invalid config."""
    import anyio

    from sparkd.launch.render import render
    from sparkd.preflight.runner import CHECK_IDS, DEFAULT_CHECKS, run_standalone
    from sparkd.runtime import make_runtime

    unknown = [c for c in only if c not in CHECK_IDS]
    if unknown:
        fail(f"--check {unknown[0]}: no such check (the checks: {', '.join(CHECK_IDS)})", 2)
    cfg = linted_config_or_exit(config_path)
    checks = tuple(c for c in DEFAULT_CHECKS if c.id in only) if only else DEFAULT_CHECKS
    report = anyio.run(lambda: run_standalone(cfg, render(cfg), make_runtime(cfg), dry_run=dry_run, checks=checks))
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
    elif quiet:
        failure = report.failure()
        if failure is not None:
            click.echo(f"not ready: {failure.sentence} [{failure.cls.value}]", err=True)
    else:
        for r in report.results:
            line = f"{r.verdict.value:<5}  {r.id:<15} {r.found}"
            click.echo(line + (f" -> {r.did}" if r.did else "") + f"  ({r.duration_s:.2f} s)")
        failure = report.failure()
        verdict = "dry run: " if dry_run else ""
        click.echo(verdict + (f"not ready: {failure.sentence} [{failure.cls.value}]" if failure
                              else "ready to launch"))
    raise SystemExit(0 if report.ok else 1)


@main.group("weights", epilog="Exit status: that of its subcommand (verify: 0 sound; 1 a problem; 2 an invalid "
                                "config).")
def weights_group() -> None:
    """The model directory's manifest (sizes, mtimes, sha256) on this node."""


@weights_group.command("verify", epilog="Exit status: 0 sound; 1 a problem; 2 an invalid config.")
@config_option
@click.option("--full", is_flag=True, help="Hash every shard again, whatever its size and mtime (reads it all).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and the problems as JSON.")
def weights_verify_cmd(config_path: Path, full: bool, as_json: bool) -> None:
    """Build this node's manifest (new or changed shards hashed, at the idle I/O class), check every index against
    it and, with --full, that no shard changed in place. Exit 0 sound, 1 a problem, 2 invalid config."""
    from sparkd.cli.weights import verify

    raise SystemExit(verify(config_or_exit(config_path), full=full, as_json=as_json))


@main.command("import-compose", epilog=(
    "Exit status: "
    "0 the config printed (or written), what was not carried on stderr; 2 the file cannot be "
    "converted (the problem named)."))
@click.argument("compose_file", type=click.Path(path_type=Path))
@click.option("--service", default=None, help="The service to import (needed when the file has several).")
@click.option("--env-file", type=click.Path(path_type=Path), default=None,
              help="Variables for ${...} in the file (default: the .env beside it, as docker compose reads it).")
@click.option("--runtime", type=click.Choice(["docker-run", "docker-exec"]), default="docker-run", show_default=True,
              help="docker-run: a fresh container per launch, vLLM its main process (as compose runs it); "
                   "docker-exec: a long-lived container vLLM is exec'd into.")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None,
              help="Write the config to this new file (mode 0600) instead of printing it.")
@click.option("--force", is_flag=True, help="With --output: replace an existing regular file (never a symlink).")
def import_compose_cmd(compose_file: Path, service: str | None, env_file: Path | None, runtime: str,
                       output: Path | None, force: bool) -> None:
    """Turn a docker-compose service into a sparkd config (TOML), naming what it could not carry.

    Exit 0 with the config; 2 when the file cannot be converted (the problem named)."""
    from sparkd.cli.compose import ComposeError, import_compose

    try:
        imported = import_compose(compose_file, service=service, env_file=env_file, runtime=runtime)
    except ComposeError as exc:
        fail(f"sparkd: import-compose: {exc}", EXIT_INVALID_CONFIG)
    for note in imported.not_carried:
        click.echo(f"not carried: {note}", err=True)
    if output is None:
        click.echo(imported.toml, nl=False)
        return
    from sparkd.cli.outputs import OutputRefused, write_output

    try:
        write_output(output, imported.toml, force=force)
    except OutputRefused as exc:
        fail(f"sparkd: import-compose: {exc}", EXIT_INVALID_CONFIG)
    except OSError as exc:
        fail(f"sparkd: import-compose: cannot write {output}: {exc.strerror or exc}", EXIT_INVALID_CONFIG)
    click.echo(f"wrote {output}", err=True)


@main.command("explain", epilog="Exit status: 0 explained; 2 the log or the config cannot be read, or an option is "
              "wrong.")
@click.argument("logfile")
@click.option("--exit-code", type=click.IntRange(0, 255), default=None,
              help="How the process exited (a shell's 128+N is read as signal N).")
@click.option("--signal", "sig", default=None, help="The signal that ended it: SIGKILL, TERM, 9, ...")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="The config the log's launch ran with: its launch target and ports, as the daemon knows them.")
@click.option("--json", "as_json", is_flag=True, help='Print {"class": ..., "sentence": ..., "evidence": ...}.')
def explain_cmd(logfile: str, exit_code: int | None, sig: str | None, config_path: Path | None,
                as_json: bool) -> None:
    """Explain why vLLM stopped, from its log (LOGFILE, or - for stdin): class, sentence, evidence."""
    from sparkd.cli.explain import ExplainError, explain, incident_class, parse_signal, read_tail, render

    context = None
    if config_path is not None:
        from sparkd.launch.facts import config_context

        context = config_context(config_or_exit(config_path, prog="sparkd explain"))
    try:
        number = parse_signal(sig) if sig is not None else None
        lines = read_tail(logfile)
    except ExplainError as exc:
        fail(f"sparkd explain: {exc}", EXIT_INVALID_CONFIG)
    click.echo(render(explain(lines, exit_code, number, context), as_json=as_json, incident=incident_class(logfile)))


@main.command(
    "standin",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def standin_cmd(args: tuple[str, ...]) -> None:
    """The vLLM stand-in (the sparkd-standin distribution): `sparkd standin serve MODEL [vllm flags]`."""
    from sparkd.launch.rehearsal import STANDIN, standin_executable

    program = standin_executable()
    if not os.path.isabs(program):
        fail(f"sparkd: the vLLM stand-in is not installed: no `{STANDIN}` next to {sys.executable} or on PATH "
             "(install the sparkd-standin distribution: `pip install ./standin` in a checkout, or `make setup`)")
    os.execv(program, [program, *args])
