"""``sparkctl logs``: the lines, or with ``--json`` one ``{"at": ISO time with zone, "line": ...}`` object per
line (JSON Lines, as ``journalctl -o json`` and ``kubectl logs`` feed ``jq``); ``--since`` as journalctl and
kubectl take it (a duration ago, or a time)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import click

from sparkd.host.timefmt import iso

__all__ = ["parse_since", "show_logs"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds of ``--since``: ``30s``, ``10m``, ``1h30m``, ``2d`` ago, or an ISO 8601 time (local time
    when it names no zone). Raises ``click.BadParameter`` naming what it takes."""
    now = time.time() if now is None else now
    compact = text.replace(" ", "")
    parts = _DURATION.findall(compact)
    if parts and "".join(n + u for n, u in parts) == compact:
        return now - sum(float(n) * _SCALE[u] for n, u in parts)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise click.BadParameter(f"{text!r}: give a duration ago (30s, 10m, 2h, 1d) or an ISO 8601 time "
                                 "(2026-11-27T05:00:00+00:00)", param_hint="'--since'") from None


def show_logs(obj: Any, *, lines: int, follow: bool, since: str | None) -> None:
    from sparkd.api.client import DaemonUnreachable
    from sparkd.commands import logs

    request = logs.Request(lines=lines, follow=follow, since=parse_since(since) if since else None,
                           stamps=obj.as_json)
    try:
        if follow:
            with obj.client() as client:
                for raw in client.stream(logs.COMMAND, request):
                    click.echo(_stamped_line(raw) if obj.as_json else raw)
        else:
            for item in obj.call(logs.COMMAND, request):
                click.echo(json.dumps({"at": iso(item["at"]), "line": item["line"]}) if obj.as_json else item)
    except DaemonUnreachable as exc:
        obj.unreachable(exc)
    except KeyboardInterrupt:
        pass


def _stamped_line(raw: str) -> str:
    try:
        item = json.loads(raw)
        return json.dumps({"at": iso(item["at"]), "line": item["line"]})
    except (ValueError, KeyError, TypeError):
        return json.dumps({"at": None, "line": raw})
