"""``sparkctl``: the operator's command line for a running sparkd.

Each subcommand is one command module of :mod:`sparkd.commands` (its request, the daemon's answer, the text).
``--json``, ``--socket`` and ``--config`` are accepted before or after the subcommand. ``status`` exit codes
follow LSB: 0 ready, 1 degraded or failed, 3 not serving (stopped, starting, backoff, …), 4 unreachable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from sparkd import __version__
from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
from sparkd.cli.common import config_or_exit
from sparkd.cli.progress import wait_for
from sparkd.commands import (
    handover,
    incidents,
    logs,
    preflight,
    recreate,
    reload,
    reset,
    restart,
    start,
    status,
    stop,
    weights,
)
from sparkd.commands.act import LOCAL_RISK
from sparkd.commands.act import Request as ActRequest
from sparkd.commands.status import EXIT_NOT_SERVING, EXIT_READY, EXIT_UNHEALTHY, EXIT_UNREACHABLE

DEFAULT_SOCKET = Path("/run/sparkd/sparkd.sock")


@dataclass
class Ctx:
    socket: Path | None = None
    config: Path | None = None
    as_json: bool = False

    def socket_path(self) -> Path:
        if self.socket is not None:
            return self.socket
        if self.config is not None:
            return config_or_exit(self.config, prog="sparkctl").paths.socket
        return DEFAULT_SOCKET

    def client(self, timeout_s: float = 10.0) -> ControlClient:
        return ControlClient(self.socket_path(), timeout_s=timeout_s)

    def call(self, command: Any, request: Any, *, timeout_s: float = 10.0) -> Any:
        try:
            with self.client(timeout_s) as client:
                return client.call(command, request, timeout_s=timeout_s)
        except DaemonUnreachable as exc:
            self.unreachable(exc)
        except ActionRefused as exc:
            self.refused(command.NAME, exc)

    def emit(self, result: Any, text: Callable[[Any], str]) -> None:
        click.echo(json.dumps(result, indent=2) if self.as_json else text(result))

    def unreachable(self, exc: DaemonUnreachable) -> NoReturn:
        if self.as_json:
            click.echo(json.dumps({"state": "unreachable", "ready": False, "error": str(exc)}))
        else:
            click.echo(f"sparkctl: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)

    def refused(self, name: str, exc: ActionRefused) -> NoReturn:
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
                     help="Take the socket from this sparkd config."),
        click.option("--socket", type=click.Path(path_type=Path, readable=False), expose_value=False,
                     callback=_set("socket"),
                     help=f"The daemon's control socket (default {DEFAULT_SOCKET})."),
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


@main.command("status")
@global_options
@click.pass_obj
def status_cmd(obj: Ctx) -> None:
    """Node, role, state, phase, uptime, PID, restarts, last failure, breaker, guard and peers."""
    result = obj.call(status, status.Request())
    obj.emit(result, status.render)
    sys.exit(status.exit_code(result))


local_option = click.option("--local", is_flag=True, help="Act on this node's rank only (maintenance).")
wait_option = click.option("--wait", is_flag=True, help="Follow it until done (ready, stopped or failed).")
timeout_option = click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
                              help="With --wait: give up after this many seconds.")


def _lifecycle(command: Any, *, waits_for: str | None) -> None:
    """One subcommand for start, stop, restart: post it, then optionally follow it."""

    @main.command(command.NAME, help=(command.__doc__ or "").split(":", 1)[-1].strip().split("\n\n")[0])
    @global_options
    @local_option
    @wait_option
    @timeout_option
    @click.pass_obj
    def run(obj: Ctx, local: bool, wait: bool, timeout_s: float) -> None:
        if local:
            click.echo(f"sparkctl: {LOCAL_RISK}", err=True)
        before = obj.call(status, status.Request()) if wait else None
        result = obj.call(command, ActRequest(local=local))
        if before is None or waits_for is None:
            obj.emit(result, command.render)
            return
        sys.exit(wait_for(obj, waits_for, before, timeout_s))


_lifecycle(start, waits_for="ready")
_lifecycle(stop, waits_for="stopped")
_lifecycle(restart, waits_for="ready")


@main.command("reset")
@global_options
@click.pass_obj
def reset_cmd(obj: Ctx) -> None:
    """Close the restart breaker and forget failures; starts vLLM if it should run."""
    obj.emit(obj.call(reset, ActRequest()), reset.render)


@main.command("reload")
@global_options
@click.pass_obj
def reload_cmd(obj: Ctx) -> None:
    """Read and validate the config on disk; show what changed. Exit 1 (nothing changed) when it is invalid."""
    obj.emit(obj.call(reload, reload.Request(), timeout_s=60), reload.render)


@main.command("recreate")
@global_options
@click.pass_obj
def recreate_cmd(obj: Ctx) -> None:
    """Replace vLLM's container with one made from the config (while vLLM is stopped)."""
    obj.emit(obj.call(recreate, recreate.Request(), timeout_s=300), recreate.render)


@main.command("handover")
@global_options
@click.pass_obj
def handover_cmd(obj: Ctx) -> None:
    """Exit sparkd now and leave vLLM running for the next sparkd to adopt (package upgrades)."""
    obj.emit(obj.call(handover, handover.Request()), handover.render)


@main.command("logs")
@global_options
@click.option("-n", "--lines", type=click.IntRange(min=0), default=logs.DEFAULT_LINES, show_default=True)
@click.option("-f", "--follow", is_flag=True)
@click.pass_obj
def logs_cmd(obj: Ctx, lines: int, follow: bool) -> None:
    """vLLM's output as sparkd saw it (secrets redacted)."""
    request = logs.Request(lines=lines, follow=follow)
    try:
        if follow:
            with obj.client() as client:
                for line in client.stream(logs, request):
                    click.echo(line)
        else:
            for line in obj.call(logs, request):
                click.echo(line)
    except DaemonUnreachable as exc:
        obj.unreachable(exc)
    except KeyboardInterrupt:
        pass


@main.command("incidents")
@global_options
@click.argument("incident_id", required=False)
@click.pass_obj
def incidents_cmd(obj: Ctx, incident_id: str | None) -> None:
    """Failures with their class, sentence and evidence folder, newest first; or one with its log tail."""
    obj.emit(obj.call(incidents, incidents.Request(incident_id)), incidents.render)


@main.command("preflight")
@global_options
@click.option("--dry-run", is_flag=True, help="Report what would be fixed; change nothing.")
@click.pass_obj
def preflight_cmd(obj: Ctx, dry_run: bool) -> None:
    """Run the preflight checks now through the daemon. Exit 0 ready to launch, 1 a check failed."""
    result = obj.call(preflight, preflight.Request(dry_run=dry_run), timeout_s=600)
    obj.emit(result, preflight.render)
    sys.exit(preflight.exit_code(result))


@main.command("weights")
@global_options
@click.option("--full", is_flag=True, help="Hash every shard again on every node (reads the whole directory).")
@click.pass_obj
def weights_cmd(obj: Ctx, full: bool) -> None:
    """The model directory on every node compared (on a group's head), or this node's. Exit 0 same, 1 differ."""
    result = obj.call(weights, weights.Request(full=full), timeout_s=weights.TIMEOUT_S if full else 600)
    obj.emit(result, weights.render)
    sys.exit(weights.exit_code(result))


__all__ = ["EXIT_NOT_SERVING", "EXIT_READY", "EXIT_UNHEALTHY", "EXIT_UNREACHABLE", "Ctx", "main"]
