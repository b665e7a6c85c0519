"""``sparkctl``: the operator's command line for a running sparkd.

Its subcommands are the registry's (:data:`sparkd.commands.OPERATOR_NAMES`): each operator command with a ``Cli``
is one, built from it when it is named (its request, the daemon's answer, the text; ``logs`` and ``incidents``
have their own options here), beside the tools that are sparkctl's alone (postmortem, bundle). A subcommand
imports its command's module when it runs: ``status`` and a TAB completion import click, the standard library's
HTTP client and a few small modules, and answer in well under 150 ms (issue 28; tests/bench). ``--json``,
``--socket`` and ``--config`` are accepted before or after the subcommand; :mod:`sparkd.cli.locate` finds the
socket. ``status`` exit codes follow LSB: 0 ready, 1 degraded or failed, 3 not serving (stopped, starting,
backoff, …), 4 unreachable; ``--wait`` that runs out of time exits 124 (as ``timeout(1)`` does).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from sparkd import __version__
from sparkd.cli.complete import incident_ids
from sparkd.commands import OPERATOR_NAMES, operator_command

if TYPE_CHECKING:  # imported on first use: a TAB completion needs none of them
    from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
    from sparkd.commands.command import Command, Params

    R = TypeVar("R", bound=Params)
    T = TypeVar("T")

DEFAULT_SOCKET = Path("/run/sparkd/sparkd.sock")  # sparkd.cli.locate.DEFAULT_SOCKET
DAEMON_UMASK = 0o027  # sparkd.cli.common.DAEMON_UMASK
# sparkd.commands.status's exit codes (LSB), and --wait's timeout (as timeout(1) exits).
EXIT_READY, EXIT_UNHEALTHY, EXIT_NOT_SERVING, EXIT_UNREACHABLE, EXIT_TIMEOUT = 0, 1, 3, 4, 124


EXIT_STATUS = {
    "status": "0 ready; 1 degraded or failed; 3 not serving (stopped, starting, backoff, ...); 4 the daemon is "
              "unreachable.",
    "start": "0 accepted (with --wait: ready); 1 refused (with --wait: the start failed); 4 unreachable; "
             "124 --wait ran out of time.",
    "reload": "0 the config on disk is valid and taken on; 1 it is invalid (nothing changed, the problems are "
              "printed); 4 unreachable.",
    "preflight": "0 ready to launch; 1 a check failed; 4 unreachable.",
    "postmortem": "0 the report is printed (a silence found is not an error); 2 --since cannot be read.",
    "bundle": "0 the bundle is written; 1 it cannot be written; 2 the config is invalid.",
    "weights": "0 the same on every node (alone: readable); 1 a file differs or cannot be read; 4 unreachable.",
    "*": "0 done; 1 refused by the daemon (the reason is printed); 4 the daemon is unreachable.",
}
EXIT_STATUS["stop"] = EXIT_STATUS["restart"] = EXIT_STATUS["start"].replace("ready", "done")


def exit_status(name: str) -> str:
    """The EXIT STATUS of a subcommand (its --help epilog and its man page)."""
    return EXIT_STATUS.get(name, EXIT_STATUS["*"])


class Ctx:
    def __init__(self, socket: Path | None = None, config: Path | None = None, as_json: bool = False) -> None:
        self.socket, self.config, self.as_json = socket, config, as_json
        self._located: Path | None = None

    def socket_path(self) -> Path:
        """The daemon's socket, found once a call; what the operator should know about --config said once."""
        if self._located is None:
            from sparkd.cli.confignote import config_note
            from sparkd.cli.locate import locate

            located = locate(self.socket, self.config)
            for note in (located.note, config_note(self.config, located.note)):
                if note:
                    click.echo(f"sparkctl: {note}", err=True)
            self._located = located.socket
        return self._located

    def client(self, timeout_s: float = 10.0) -> ControlClient:
        from sparkd.api.client import ControlClient

        return ControlClient(self.socket_path(), timeout_s=timeout_s)

    def call(self, command: Command[R, T], request: R, *, timeout_s: float = 10.0) -> T:
        from sparkd.api.client import ActionRefused, DaemonUnreachable

        try:
            with self.client(timeout_s) as client:
                return client.call(command, request, timeout_s=timeout_s)
        except DaemonUnreachable as exc:
            self.unreachable(exc)
        except ActionRefused as exc:
            self.refused(command.name, exc)

    def emit(self, result: T, text: Callable[[T], str] | None) -> None:
        import json

        click.echo(json.dumps(result, indent=2) if self.as_json or text is None else text(result))

    def unreachable(self, exc: DaemonUnreachable) -> NoReturn:
        import json

        if self.as_json:
            click.echo(json.dumps({"state": "unreachable", "ready": False, "error": str(exc)}))
        else:
            click.echo(f"sparkctl: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)

    def refused(self, name: str, exc: ActionRefused) -> NoReturn:
        import json

        if self.as_json:
            click.echo(json.dumps({"ok": False, "error": str(exc), "result": exc.result}))
        else:
            click.echo(f"sparkctl {name}: refused: {exc}", err=True)
        sys.exit(EXIT_UNHEALTHY)


def _set(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None and value is not False:
            setattr(ctx.ensure_object(Ctx), field, value)

    return callback


def global_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--socket, --config and --json, accepted on the group and on every subcommand."""
    for option in (
        click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_set("as_json"),
                     help="Machine-readable output."),
        click.option("--config", type=click.Path(path_type=Path), expose_value=False, callback=_set("config"),
                     help="Take the socket from this sparkd config (only [paths] run_dir is read)."),
        click.option("--socket", type=click.Path(path_type=Path, readable=False), expose_value=False,
                     callback=_set("socket"),
                     help=f"The daemon's control socket (default: $SPARKD_SOCKET, the demo's from its directory, else "
                          f"{DEFAULT_SOCKET})."),
    ):
        fn = option(fn)
    return fn


class Registry(click.Group):
    """The subcommands: sparkctl's own tools, and every command of the registry that has a ``Cli``, built (and
    its module imported) the first time it is named."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *OPERATOR_NAMES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in OPERATOR_NAMES:
            command = operator_command(cmd_name)
            if command.cli is None:
                return None
            self.add_command(BUILDERS.get(cmd_name, _generic)(command), cmd_name)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        if args and self.get_command(ctx, args[0]) is None:  # a typo: every name built, for click's "Did you mean"
            for name in self.list_commands(ctx):
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


@click.group(cls=Registry, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
@global_options
@click.pass_context
def main(ctx: click.Context) -> None:
    """Drive the sparkd daemon on this node: status, start, stop, restart, reset, logs, incidents, preflight."""
    os.umask(DAEMON_UMASK)  # what a command creates (a state folder, a file) has the daemon's modes
    ctx.ensure_object(Ctx)


def _epilog(name: str) -> str:
    return f"Exit status: {exit_status(name)}"


def subcommand(name: str, **kw: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """One of sparkctl's own subcommands, with the global options and its EXIT STATUS as the --help epilog."""

    def decorate(fn: Callable[..., Any]) -> click.Command:
        return main.command(name, epilog=_epilog(name), **kw)(global_options(fn))

    return decorate


def built(command: Command[Any, Any], fn: Callable[..., Any]) -> click.Command:
    """A registry command's subcommand: ``fn`` (its options applied) with the global options, its ``Cli``'s help and
    its EXIT STATUS."""
    assert command.cli is not None
    return click.command(command.name, help=command.cli.help, epilog=_epilog(command.name))(global_options(fn))


wait_option = click.option("--wait", is_flag=True, help="Follow it until done (ready, stopped or failed).")
timeout_option = click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
                              help=f"With --wait: give up after this many seconds (exit {EXIT_TIMEOUT}).")


def _generic(command: Command[Any, Any]) -> click.Command:
    """The subcommand of a command: its flags (and ``--wait``/``--timeout`` when it ``waits_for`` a state); it
    posts the request, prints the answer and exits with the command's ``exit_code`` (or, with --wait, follows it)."""
    cli = command.cli
    assert cli is not None

    @click.pass_obj
    def run(obj: Ctx, wait: bool = False, timeout_s: float = 0.0, **given: bool) -> None:
        for flag in cli.flags:
            if given[flag.field] and flag.warning:
                click.echo(f"sparkctl: {flag.warning}", err=True)
        before = None
        if wait:  # the status before, to follow the change from
            status = operator_command("status")
            before = obj.call(status, status.request())
        result = obj.call(command, command.request(**given), timeout_s=cli.timeout_for(given))
        if before is None:
            obj.emit(result, command.render)
            if command.exit_code is not None:
                sys.exit(command.exit_code(result))
            return
        from sparkd.cli.progress import wait_for

        sys.exit(wait_for(obj, cli.waits_for or "ready", before, timeout_s))

    fn: Callable[..., Any] = run
    if cli.waits_for:
        fn = wait_option(timeout_option(fn))
    for flag in reversed(cli.flags):
        fn = click.option("--" + flag.field.replace("_", "-"), is_flag=True, help=flag.help)(fn)
    return built(command, fn)


def _logs(command: Command[Any, Any]) -> click.Command:
    @click.option("-n", "--lines", type=click.IntRange(min=0), default=200, show_default=True,
                  help="How many of the last lines to show first (0: none).")
    @click.option("-f", "--follow", is_flag=True, help="Then every new line as it comes (Ctrl-C ends it).")
    @click.option("--since", default=None, metavar="WHEN",
                  help="Only lines received since WHEN: a duration ago (30s, 10m, 2h, 1d) or an ISO 8601 time "
                       "(2026-11-27T05:00:00+00:00; without a zone, local time).")
    @click.pass_obj
    def run(obj: Ctx, lines: int, follow: bool, since: str | None) -> None:
        from sparkd.cli.logview import show_logs

        show_logs(obj, lines=lines, follow=follow, since=since)

    return built(command, run)


def _incidents(command: Command[Any, Any]) -> click.Command:
    @click.argument("incident_id", required=False, shell_complete=incident_ids)
    @click.pass_obj
    def run(obj: Ctx, incident_id: str | None) -> None:
        obj.emit(obj.call(command, command.request(incident_id)), command.render)

    return built(command, run)


BUILDERS: dict[str, Callable[[Command[Any, Any]], click.Command]] = {"logs": _logs, "incidents": _incidents}


@subcommand("postmortem")
@click.option("--since", "since_text", default=None, metavar="WHEN",
              help="Only silences after WHEN: a duration ago (30m, 2h, 1d), an ISO time (UTC unless it says) or "
                   "epoch seconds.")
@click.option("--local", is_flag=True, help="This node's ring only; do not ask the peers.")
@click.pass_obj
def postmortem_cmd(obj: Ctx, since_text: str | None, local: bool) -> None:
    """What happened before each node went silent (a frozen host, a power cut, a killed sparkd), from every
    node's flight recorder, on one clock, in one sentence each with the records that show it."""
    from sparkd.cli.postmortem import postmortem

    postmortem(obj, since_text, local)


@subcommand("bundle")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write it (default: ./sparkd-bundle-NODE-TIME.tar.gz); never over an existing file.")
@click.pass_obj
def bundle_cmd(obj: Ctx, output: Path | None) -> None:
    """One tar.gz for a bug report: the config (secrets masked), status, incidents, the flight recorder's last
    hour, versions, nvidia-smi, the kernel log and the unit's journal. Reads the config (--config, default
    /etc/sparkd/sparkd.toml)."""
    from sparkd.cli.bundle import bundle

    bundle(obj, output)


__all__ = ["EXIT_NOT_SERVING", "EXIT_READY", "EXIT_TIMEOUT", "EXIT_UNHEALTHY", "EXIT_UNREACHABLE", "Ctx", "main"]
