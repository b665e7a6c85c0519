"""``GET /v1/recorder[?since=T&until=T&local=1]`` — what ``sparkctl postmortem`` reads: this node's flight-recorder
runs (one per sparkd process: first and last record, clean exit or not) and, with ``until``, its records between
``since`` and ``until`` (wall seconds); unless ``local``, the same from every peer's sparkd through the peer API
(a peer that does not answer is listed with the reason). ``result``: ``{"reference": node, "nodes": [...]}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import BadRequest, Reply, Value, flag, ok
from sparkd.commands.command import Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control


def _time(params: Mapping[str, Any], name: str) -> float | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected seconds since the epoch, got {raw!r}") from None
    if not math.isfinite(value):
        raise BadRequest(f"{name}: expected a finite time, got {raw!r}")
    return value


class Request(Value):
    __slots__ = ("local", "since", "until")

    def __init__(self, since: float | None = None, until: float | None = None, local: bool = False) -> None:
        self.since, self.until, self.local = since, until, local

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        return cls(since=_time(params, "since"), until=_time(params, "until"), local=flag(params, "local"))

    def to_params(self) -> dict[str, str]:
        out = {"local": "1"} if self.local else {}
        out.update({k: repr(v) for k, v in (("since", self.since), ("until", self.until)) if v is not None})
        return out


async def execute(control: Control, request: Request) -> Reply:
    return ok(await control.flight_records(since=request.since, until=request.until, local=request.local))


def render(result: Any) -> str:
    return "\n".join(f"{n.get('node')}: {len(n.get('runs') or [])} runs, {len(n.get('records') or [])} records"
                     + (f" ({n['error']})" if n.get("error") else "") for n in result.get("nodes", []))


# Not a sparkctl subcommand of its own: ``sparkctl postmortem`` and ``sparkctl bundle`` read it.
COMMAND: Command[Request, dict[str, Any]] = Command("recorder", "GET", Request, execute, render)
