"""``GET /v1/logs?lines=N&follow=1&since=T&stamps=1`` — ``sparkctl logs [-n N] [-f] [--since WHEN] [--json]``:
vLLM's output as sparkd saw it (secrets redacted), the last N lines (0: none) received since T (epoch seconds),
then, with follow, every new line as it comes. With ``stamps`` each line is ``{"at": epoch, "line": text}``
(the time sparkd received it; streamed as JSON Lines).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import BadRequest, Reply, Stream, flag, number, ok
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

DEFAULT_LINES = 200


@dataclass(frozen=True)
class Request:
    lines: int = DEFAULT_LINES
    follow: bool = False
    since: float | None = None
    stamps: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        raw = params.get("since") or None
        try:
            since = float(raw) if raw is not None else None
        except ValueError:
            raise BadRequest(f"since: expected seconds since the epoch, got {raw!r}") from None
        if since is not None and not math.isfinite(since):
            raise BadRequest(f"since: expected seconds since the epoch, got {raw!r}")
        return cls(lines=number(params, "lines", DEFAULT_LINES), follow=flag(params, "follow"), since=since,
                   stamps=flag(params, "stamps"))

    def to_params(self) -> dict[str, str]:
        params = {"lines": str(self.lines), "follow": "1" if self.follow else "0"}
        if self.since is not None:
            params["since"] = repr(self.since)
        if self.stamps:
            params["stamps"] = "1"
        return params


async def execute(control: Control, request: Request) -> Reply | Stream:
    if not (request.stamps or request.since is not None):
        backlog = control.log_tail(request.lines) if request.lines else []
        if request.follow:
            return Stream(control.follow_log(backlog))
        return ok(backlog)
    entries = control.log_entries(request.lines, request.since) if request.lines else []
    if request.follow:
        return Stream(_stamped(control, entries) if request.stamps else control.follow_log([e[1] for e in entries]))
    return ok([{"at": at, "line": line} for at, line in entries] if request.stamps else [e[1] for e in entries])


async def _stamped(control: Control, entries: list[tuple[float, str]]) -> AsyncIterator[str]:
    for at, line in entries:
        yield json.dumps({"at": at, "line": line})
    async for line in control.follow_log([]):
        yield json.dumps({"at": time.time(), "line": line})


COMMAND: Command[Request, list[Any]] = Command("logs", "GET", Request, execute, cli=Cli(
    help="vLLM's output as sparkd saw it (secrets redacted); --json: one {\"at\", \"line\"} object per line."))
