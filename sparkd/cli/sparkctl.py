"""``sparkctl``: the operator's command line for a running sparkd.

Each subcommand is one command module of :mod:`sparkd.commands` (its request, the daemon's answer, the text),
imported when that subcommand runs: ``status`` and a TAB completion import click, the standard library's HTTP
client and one small module, and answer in well under 150 ms (issue 28; tests/bench). ``--json``, ``--socket``
and ``--config`` are accepted before or after the subcommand; :mod:`sparkd.cli.locate` finds the socket.
``status`` exit codes follow LSB: 0 ready, 1 degraded or failed, 3 not serving (stopped, starting, backoff, …),
4 unreachable; ``--wait`` that runs out of time exits 124 (as ``timeout(1)`` does).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from sparkd import __version__
from sparkd.cli.complete import incident_ids

if TYPE_CHECKING:  # imported on first use: a TAB completion needs none of them
    from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable

DEFAULT_SOCKET = Path("/run/sparkd/sparkd.sock")  # sparkd.cli.locate.DEFAULT_SOCKET
# sparkd.commands.status's exit codes (LSB), and --wait's timeout (as timeout(1) exits).
EXIT_READY, EXIT_UNHEALTHY, EXIT_NOT_SERVING, EXIT_UNREACHABLE, EXIT_TIMEOUT = 0, 1, 3, 4, 124


def command(name: str) -> Any:
    """The command module ``sparkd.commands.<name>``, imported now."""
    return importlib.import_module(f"sparkd.commands.{name}")


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

    def call(self, command: Any, request: Any, *, timeout_s: float = 10.0) -> Any:
        from sparkd.api.client import ActionRefused, DaemonUnreachable

        try:
            with self.client(timeout_s) as client:
                return client.call(command, request, timeout_s=timeout_s)
        except DaemonUnreachable as exc:
            self.unreachable(exc)
        except ActionRefused as exc:
            self.refused(command.NAME, exc)

    def emit(self, result: Any, text: Callable[[Any], str]) -> None:
        import json

        click.echo(json.dumps(result, indent=2) if self.as_json else text(result))

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
@global_options
@click.pass_context
def main(ctx: click.Context) -> None:
    """Drive the sparkd daemon on this node: status, start, stop, restart, reset, logs, incidents, preflight."""
    ctx.ensure_object(Ctx)


def subcommand(name: str, **kw: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """A sparkctl subcommand with the global options and its EXIT STATUS as the --help epilog."""

    def decorate(fn: Callable[..., Any]) -> click.Command:
        return main.command(name, epilog=f"Exit status: {exit_status(name)}", **kw)(global_options(fn))

    return decorate


@subcommand("status")
@click.pass_obj
def status_cmd(obj: Ctx) -> None:
    """Node, role, state, phase, uptime, PID, restarts, last failure, breaker, guard and peers."""
    status = command("status")
    result = obj.call(status, status.Request())
    obj.emit(result, status.render)
    sys.exit(status.exit_code(result))


local_option = click.option("--local", is_flag=True, help="Act on this node's rank only (maintenance).")
wait_option = click.option("--wait", is_flag=True, help="Follow it until done (ready, stopped or failed).")
timeout_option = click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
                              help=f"With --wait: give up after this many seconds (exit {EXIT_TIMEOUT}).")

LIFECYCLE = {
    "start": ("ready", "Start vLLM. Refused while the restart breaker is open (reset or restart close it). On a "
                       "group's worker the head starts the whole group."),
    "stop": ("stopped", "Stop vLLM and keep it stopped, also across daemon restarts, until start or restart. On "
                        "a group's worker the head stops the whole group."),
    "restart": ("ready", "Stop vLLM, preflight, start it again; also closes the breaker and forgets the failures. "
                         "It reloads the config on disk first (an invalid one refuses the restart)."),
}


def _lifecycle(name: str, waits_for: str, text: str) -> None:
    """One subcommand for start, stop, restart: post it, then optionally follow it."""

    @subcommand(name, help=text)
    @local_option
    @wait_option
    @timeout_option
    @click.pass_obj
    def run(obj: Ctx, local: bool, wait: bool, timeout_s: float) -> None:
        from sparkd.commands.act import LOCAL_RISK
        from sparkd.commands.act import Request as ActRequest

        if local:
            click.echo(f"sparkctl: {LOCAL_RISK}", err=True)
        act = command(name)
        before = obj.call(command("status"), command("status").Request()) if wait else None
        result = obj.call(act, ActRequest(local=local))
        if before is None:
            obj.emit(result, act.render)
            return
        from sparkd.cli.progress import wait_for

        sys.exit(wait_for(obj, waits_for, before, timeout_s))


for _name, (_target, _text) in LIFECYCLE.items():
    _lifecycle(_name, _target, _text)


@subcommand("reset")
@click.pass_obj
def reset_cmd(obj: Ctx) -> None:
    """Close the restart breaker and forget failures; starts vLLM if it should run."""
    from sparkd.commands.act import Request as ActRequest

    reset = command("reset")
    obj.emit(obj.call(reset, ActRequest()), reset.render)


@subcommand("reload")
@click.pass_obj
def reload_cmd(obj: Ctx) -> None:
    """Read and validate the config on disk; show what changed. Exit 1 (nothing changed) when it is invalid."""
    reload = command("reload")
    obj.emit(obj.call(reload, reload.Request(), timeout_s=60), reload.render)


@subcommand("recreate")
@click.pass_obj
def recreate_cmd(obj: Ctx) -> None:
    """Replace vLLM's container with one made from the config (while vLLM is stopped)."""
    recreate = command("recreate")
    obj.emit(obj.call(recreate, recreate.Request(), timeout_s=300), recreate.render)


@subcommand("handover")
@click.pass_obj
def handover_cmd(obj: Ctx) -> None:
    """Exit sparkd now and leave vLLM running for the next sparkd to adopt (package upgrades)."""
    handover = command("handover")
    obj.emit(obj.call(handover, handover.Request()), handover.render)


@subcommand("logs")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=200, show_default=True,
              help="How many of the last lines to show first (0: none).")
@click.option("-f", "--follow", is_flag=True, help="Then every new line as it comes (Ctrl-C ends it).")
@click.option("--since", default=None, metavar="WHEN",
              help="Only lines received since WHEN: a duration ago (30s, 10m, 2h, 1d) or an ISO 8601 time "
                   "(2026-11-27T05:00:00+00:00; without a zone, local time).")
@click.pass_obj
def logs_cmd(obj: Ctx, lines: int, follow: bool, since: str | None) -> None:
    """vLLM's output as sparkd saw it (secrets redacted); --json: one {"at", "line"} object per line."""
    from sparkd.cli.logview import show_logs

    show_logs(obj, lines=lines, follow=follow, since=since)


@subcommand("incidents")
@click.argument("incident_id", required=False, shell_complete=incident_ids)
@click.pass_obj
def incidents_cmd(obj: Ctx, incident_id: str | None) -> None:
    """Failures with their class, sentence and evidence folder, newest first; or one with its log tail."""
    incidents = command("incidents")
    obj.emit(obj.call(incidents, incidents.Request(incident_id)), incidents.render)


@subcommand("preflight")
@click.option("--dry-run", is_flag=True, help="Report what would be fixed; change nothing.")
@click.pass_obj
def preflight_cmd(obj: Ctx, dry_run: bool) -> None:
    """Run the preflight checks now through the daemon. Exit 0 ready to launch, 1 a check failed."""
    preflight = command("preflight")
    result = obj.call(preflight, preflight.Request(dry_run=dry_run), timeout_s=600)
    obj.emit(result, preflight.render)
    sys.exit(preflight.exit_code(result))


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
@subcommand("weights")
@click.option("--full", is_flag=True, help="Hash every shard again on every node (reads the whole directory).")
@click.pass_obj
def weights_cmd(obj: Ctx, full: bool) -> None:
    """The model directory on every node compared (on a group's head), or this node's. Exit 0 same, 1 differ."""
    weights = command("weights")
    result = obj.call(weights, weights.Request(full=full), timeout_s=weights.TIMEOUT_S if full else 600)
    obj.emit(result, weights.render)
    sys.exit(weights.exit_code(result))


__all__ = ["EXIT_NOT_SERVING", "EXIT_READY", "EXIT_TIMEOUT", "EXIT_UNHEALTHY", "EXIT_UNREACHABLE", "Ctx", "main"]
