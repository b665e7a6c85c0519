"""``sparkctl start|stop|restart --wait``: follow the daemon until the command is done.

On a terminal a live line (rich) shows the state, the startup phase with shard i/N while weights load, the
elapsed time and an ETA from the last cold start; piped, every recorded state and phase is one plain line, so
logs and scripts read it. Exit 0 when done (ready, or stopped), 1 when the start failed, 124 when ``--timeout``
ran out first (the daemon goes on with it).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Protocol

import click

from sparkd.api.client import ActionRefused, DaemonUnreachable
from sparkd.commands import status as status_command

POLL_S = 0.25

PHASE_TEXT = {"memory_settle": "waiting for the memory an earlier start used to come back",
              "waiting_for_workers": "waiting for the workers' sparkd to answer", "launching": "launching",
              "waiting_for_peer": "waiting for the peer ranks",
              "loading_weights": "loading weights", "compiling": "compiling and profiling", "kv_cache": "KV cache",
              "graph_capture": "capturing CUDA graphs", "api_starting": "starting the API server",
              "ready": "API up, checking /health"}


class Caller(Protocol):
    as_json: bool

    def client(self, timeout_s: float = 10.0) -> Any: ...

    def unreachable(self, exc: DaemonUnreachable) -> Any: ...


def describe_step(entry: dict[str, Any]) -> str:
    phase = entry.get("phase")
    if not phase:
        return str(entry["state"])
    if entry.get("drain"):  # a stop drains vLLM's requests in flight: "stopping: draining: 3 in flight, 97 s left"
        return f"{entry['state']}: {entry['drain'].get('sentence', phase)}"
    text = PHASE_TEXT.get(phase, phase)
    if entry.get("shards"):
        text += f" {entry['shards'][0]}/{entry['shards'][1]} shards"
    return f"{entry['state']}: {text}"


def outcome(target: str, s: dict[str, Any], launches_before: int) -> int | None:
    """EXIT code once the wait is over, else None."""
    state, new_launch = s.get("state"), s.get("launches", 0) > launches_before
    if target == "stopped":
        if state in ("stopped", "failed") and not s.get("pid"):
            return status_command.EXIT_READY
        return None
    if state == "ready" and new_launch:
        return status_command.EXIT_READY
    held = state == "accepting" and (s.get("acceptance") or {}).get("refused")
    if new_launch and (state == "degraded" or held):  # serving with the gate's warning, or held by its refusal
        return status_command.EXIT_UNHEALTHY
    if state in ("failed", "backoff") or (state == "stopped" and new_launch):
        return status_command.EXIT_UNHEALTHY
    return None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    return f"{minutes:02d}:{secs:02d}"


def live_text(target: str, s: dict[str, Any], elapsed: float) -> str:
    text = f"{s.get('state', '?')}"
    if s.get("phase") and s.get("state") in ("preflight", "starting"):
        text = describe_step({"state": s["state"], "phase": s["phase"], "shards": s.get("shards")})
    elif s.get("drain") and s.get("state") == "stopping":
        text = describe_step({"state": s["state"], "phase": "draining", "drain": s["drain"]})
    running = (s.get("acceptance") or {}).get("running") if s.get("state") == "accepting" else None
    if running:
        text += f": the acceptance gate, {running.get('line')}"
    text += f"   {_clock(elapsed)} elapsed"
    last = s.get("last_start_s")
    if target == "ready" and last and s.get("state") in ("preflight", "starting", "accepting"):
        if elapsed <= last:
            text += f", ETA ~{_clock(last - elapsed)} (last cold start took {_clock(last)})"
        else:
            text += f", past the last cold start's {_clock(last)}"
    return text


def wait_for(obj: Caller, target: str, before: dict[str, Any], timeout_s: float) -> int:
    """Follow the daemon from ``before`` (its status when the command was sent) until ``target``."""
    launches_before = int(before.get("launches", 0)) if target == "ready" else 0
    live = sys.stdout.isatty() and not obj.as_json
    started_wall, started = time.time(), time.monotonic()
    printed = 0.0
    display = _Live() if live else None
    try:
        while time.monotonic() - started < timeout_s:
            s = _status(obj)
            for entry in s.get("history", []):
                if entry["at"] >= started_wall - 0.5 and entry["at"] > printed:
                    printed = entry["at"]
                    if not live and not obj.as_json:
                        click.echo(f"[{max(0.0, entry['at'] - started_wall):7.1f}s] {describe_step(entry)}")
            if display is not None:
                display.update(live_text(target, s, time.monotonic() - started))
            code = outcome(target, s, launches_before)
            if code is not None:
                if display is not None:
                    display.close()
                    display = None
                _finish(obj, target, s, code, time.monotonic() - started)
                return code
            time.sleep(POLL_S)
    finally:
        if display is not None:
            display.close()
    click.echo(f"sparkctl: not {target} after {timeout_s:.0f} s (timed out, exit {status_command.EXIT_TIMEOUT}; "
               "the daemon goes on)", err=True)
    return status_command.EXIT_TIMEOUT


def _status(obj: Caller) -> dict[str, Any]:
    try:
        with obj.client() as client:
            data = client.call(status_command.COMMAND, status_command.Request())
            return data
    except DaemonUnreachable as exc:
        obj.unreachable(exc)
    except ActionRefused as exc:
        return {"state": "unknown", "error": str(exc)}
    raise AssertionError("unreachable")


def _finish(obj: Caller, target: str, s: dict[str, Any], code: int, elapsed: float) -> None:
    if obj.as_json:
        click.echo(json.dumps(s, indent=2))
    elif code == status_command.EXIT_READY:
        click.echo(f"{target} after {elapsed:.1f} s")
    else:
        failure = s.get("last_failure") or {}
        click.echo(f"start failed ({failure.get('class', s.get('state'))}): {failure.get('message', '')}")


class _Live:
    """One line that rewrites itself on a terminal (rich), closed before the final line is printed."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live("", console=Console(), refresh_per_second=8, transient=True)
        self._live.start()

    def update(self, text: str) -> None:
        from rich.text import Text

        self._live.update(Text(text))

    def close(self) -> None:
        self._live.stop()
