"""``sparkctl``: the operator's command line for a running sparkd.

``status`` exit codes follow LSB: 0 ready, 1 degraded or failed, 3 not serving (stopped, starting,
backoff, ...), 4 the daemon is unreachable.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from sparkd import __version__
from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
from sparkd.cli.common import config_or_exit, fail

EXIT_READY, EXIT_UNHEALTHY, EXIT_NOT_SERVING, EXIT_UNREACHABLE = 0, 1, 3, 4
DEFAULT_SOCKET = Path("/run/sparkd/sparkd.sock")


@dataclass
class Ctx:
    socket: Path
    as_json: bool

    def client(self, timeout_s: float = 10.0) -> ControlClient:
        return ControlClient(self.socket, timeout_s=timeout_s)


def status_exit_code(status: dict[str, Any]) -> int:
    state = status.get("state")
    if state == "ready":
        return EXIT_READY
    if state in ("degraded", "failed"):
        return EXIT_UNHEALTHY
    return EXIT_NOT_SERVING


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkctl")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
              help=f"The daemon's control socket (default {DEFAULT_SOCKET}).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="Take the socket from this sparkd config.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def main(ctx: click.Context, socket_path: Path | None, config_path: Path | None, as_json: bool) -> None:
    """Drive the sparkd daemon on this node: status, start, stop, restart, reset, logs."""
    if socket_path is None and config_path is not None:
        socket_path = config_or_exit(config_path, prog="sparkctl").paths.socket
    ctx.obj = Ctx(socket=socket_path or DEFAULT_SOCKET, as_json=as_json)


def _unreachable(exc: DaemonUnreachable, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"state": "unreachable", "ready": False, "error": str(exc)}))
    else:
        click.echo(f"sparkctl: {exc}", err=True)
    sys.exit(EXIT_UNREACHABLE)


@main.command()
@click.pass_obj
def status(obj: Ctx) -> None:
    """Node, role, state, phase, uptime, PID, restarts, last failure, breaker."""
    try:
        with obj.client() as client:
            data = client.status()
    except DaemonUnreachable as exc:
        _unreachable(exc, obj.as_json)
    click.echo(json.dumps(data, indent=2) if obj.as_json else render_status(data))
    sys.exit(status_exit_code(data))


def _ago(ts: float | None) -> str:
    if not ts:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def render_status(s: dict[str, Any]) -> str:
    lines = [f"sparkd {s.get('version', '?')} on {s['node']} ({s['role']}, {s['runtime']}): "
             f"{s['state']} since {_ago(s.get('since'))}"]
    facts = [f"pid {s['pid']}" if s.get("pid") else "no vLLM process", f"restarts {s['restarts']}"]
    if s.get("uptime_s") is not None:
        facts.append(f"ready for {s['uptime_s']:.0f} s")
    if s.get("phase"):
        shards = s.get("shards")
        facts.append(f"phase {s['phase']}" + (f" ({shards[0]}/{shards[1]} shards)" if shards else ""))
    lines.append("  " + ", ".join(facts))
    if s.get("health"):
        lines.append(f"  health: {s['health']}")
    if s.get("backoff_until"):
        lines.append(f"  next start at {_ago(s['backoff_until'])}")
    if s.get("breaker", {}).get("open"):
        lines.append(f"  breaker OPEN: {s['breaker']['reason']}")
    failure = s.get("last_failure")
    if failure:
        lines.append(f"  last failure ({failure['class']}, {_ago(failure.get('at'))}): {failure['message']}")
    memory = s.get("memory")
    if memory and memory.get("available_bytes") is not None:
        lines.append(f"  memory available: {memory['available_bytes'] / 2**30:.1f} GiB")
    return "\n".join(lines)


LOCAL_RISK = ("--local acts on this node's rank alone: the other rank loses its peer (a headless worker hangs, "
              "the head fails its next request) and the pair restarts as a unit afterwards.")


def _act(obj: Ctx, name: str, local: bool = False) -> dict[str, Any]:
    if local:
        click.echo(f"sparkctl: {LOCAL_RISK}", err=True)
    try:
        with obj.client() as client:
            return client.action(name, local=local)
    except DaemonUnreachable as exc:
        _unreachable(exc, obj.as_json)
    except ActionRefused as exc:
        if obj.as_json:
            click.echo(json.dumps({"ok": False, "error": str(exc)}))
        fail(f"sparkctl {name}: refused: {exc}", EXIT_UNHEALTHY)
    raise AssertionError("unreachable")


local_option = click.option("--local", is_flag=True, help="Act on this node's rank only (maintenance).")


def _accepted(name: str, result: dict[str, Any]) -> str:
    where = f" by the head {result['forwarded_to']}" if result.get("forwarded_to") else ""
    return f"{name}: accepted{where} (state {result['status']['state']})"


def _simple(name: str, help_text: str) -> None:
    @main.command(name, help=help_text + " On a pair's worker it acts on the whole pair through the head.")
    @local_option
    @click.pass_obj
    def command(obj: Ctx, local: bool) -> None:
        result = _act(obj, name, local)
        click.echo(json.dumps(result, indent=2) if obj.as_json else _accepted(name, result))


_simple("start", "Start vLLM (refused while the breaker is open: use reset or restart).")
_simple("stop", "Stop vLLM and keep it stopped.")


@main.command()
@click.pass_obj
def reset(obj: Ctx) -> None:
    """Close the restart breaker and forget failures; starts vLLM if it should run."""
    result = _act(obj, "reset")
    click.echo(json.dumps(result, indent=2) if obj.as_json else _accepted("reset", result))


@main.command()
@click.option("--wait", is_flag=True, help="Follow the cold start through its phases until ready or failed.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True)
@local_option
@click.pass_obj
def restart(obj: Ctx, wait: bool, timeout_s: float, local: bool) -> None:
    """Stop vLLM, preflight, start it again; also closes the breaker. On a pair's worker: the whole pair."""
    result = _act(obj, "restart", local)
    before = result["status"]
    if not wait:
        click.echo(json.dumps(result, indent=2) if obj.as_json else _accepted("restart", result))
        return
    sys.exit(wait_for_start(obj, before.get("launches", 0), timeout_s))


PHASE_TEXT = {"launching": "launching", "waiting_for_peer": "waiting for the peer rank",
              "loading_weights": "loading weights", "kv_cache": "KV cache", "graph_capture": "capturing CUDA graphs",
              "api_starting": "starting the API server", "ready": "API up, checking /health"}


def describe_step(entry: dict[str, Any]) -> str:
    phase = entry.get("phase")
    if not phase:
        return str(entry["state"])
    text = PHASE_TEXT.get(phase, phase)
    if entry.get("shards"):
        text += f" {entry['shards'][0]}/{entry['shards'][1]} shards"
    return f"{entry['state']}: {text}"


def wait_for_start(obj: Ctx, launches_before: int, timeout_s: float) -> int:
    """Print every state and phase the daemon records after the request, until ready or a failure."""
    started_wall, started = time.time(), time.monotonic()
    printed = 0.0
    while time.monotonic() - started < timeout_s:
        try:
            with obj.client() as client:
                s = client.status()
        except DaemonUnreachable as exc:
            _unreachable(exc, obj.as_json)
        for entry in s.get("history", []):
            if entry["at"] >= started_wall - 0.5 and entry["at"] > printed:
                printed = entry["at"]
                if not obj.as_json:
                    click.echo(f"[{max(0.0, entry['at'] - started_wall):7.1f}s] {describe_step(entry)}")
        new_launch = s.get("launches", 0) > launches_before
        if s["state"] == "ready" and new_launch:
            if obj.as_json:
                click.echo(json.dumps(s, indent=2))
            return EXIT_READY
        if s["state"] in ("failed", "backoff") or (s["state"] == "stopped" and new_launch):
            failure = s.get("last_failure") or {}
            if obj.as_json:
                click.echo(json.dumps(s, indent=2))
            else:
                click.echo(f"start failed ({failure.get('class', s['state'])}): {failure.get('message', '')}")
            return EXIT_UNHEALTHY
        time.sleep(0.25)
    click.echo(f"sparkctl: not ready after {timeout_s:.0f} s", err=True)
    return EXIT_UNHEALTHY


@main.command()
@click.option("-n", "--lines", type=int, default=200, show_default=True)
@click.option("-f", "--follow", is_flag=True)
@click.pass_obj
def logs(obj: Ctx, lines: int, follow: bool) -> None:
    """vLLM's output as sparkd saw it."""
    try:
        with obj.client() as client:
            for line in client.logs(lines, follow):
                click.echo(line)
    except DaemonUnreachable as exc:
        _unreachable(exc, obj.as_json)
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("incident_id", required=False)
@click.pass_obj
def incidents(obj: Ctx, incident_id: str | None) -> None:
    """Failures with their class, sentence and evidence folder, newest first; or one with its log tail."""
    try:
        with obj.client() as client:
            if incident_id:
                item = client.incident(incident_id)
                if item is None:
                    fail(f"sparkctl: no incident {incident_id!r}", EXIT_UNHEALTHY)
                click.echo(json.dumps(item, indent=2) if obj.as_json else
                           f"{item['at_utc']}  {item['class']}: {item['message']}\n{item['path']}\n\n"
                           f"{item['log_tail']}")
                return
            items = client.incidents()
    except DaemonUnreachable as exc:
        _unreachable(exc, obj.as_json)
    if obj.as_json:
        click.echo(json.dumps(items, indent=2))
        return
    for item in items:
        click.echo(f"{Path(item['path']).name}  {item['class']:<20} {item['message']}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Report what would be fixed; change nothing.")
@click.pass_obj
def preflight(obj: Ctx, dry_run: bool) -> None:
    """Run the preflight checks now through the daemon. Exit 0 ready to launch, 1 a check failed."""
    try:
        with obj.client(timeout_s=600) as client:
            report = client.preflight(dry_run=dry_run)
    except DaemonUnreachable as exc:
        _unreachable(exc, obj.as_json)
    except ActionRefused as exc:
        fail(f"sparkctl preflight: refused: {exc}", EXIT_UNHEALTHY)
    if obj.as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for r in report["results"]:
            did = f" -> {r['did']}" if r.get("did") else ""
            click.echo(f"{r['verdict']:<6} {r['id']:<18} {r['found']}{did} ({r['duration_s'] * 1000:.0f} ms)")
    sys.exit(EXIT_READY if report["ok"] else EXIT_UNHEALTHY)
