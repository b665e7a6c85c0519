"""``GET /v1/logs?lines=N&follow=1`` — ``sparkctl logs [-n N] [-f]``: vLLM's output as sparkd saw it (secrets
redacted), the last N lines (0: none), then, with follow, every new line as it comes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkd.commands.base import Control, Reply, Stream, flag, number, ok

NAME = "logs"
METHOD = "GET"
DEFAULT_LINES = 200


@dataclass(frozen=True)
class Request:
    lines: int = DEFAULT_LINES
    follow: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Request:
        return cls(lines=number(params, "lines", DEFAULT_LINES), follow=flag(params, "follow"))

    def to_params(self) -> dict[str, str]:
        return {"lines": str(self.lines), "follow": "1" if self.follow else "0"}


async def execute(control: Control, request: Request) -> Reply | Stream:
    backlog = control.log_tail(request.lines) if request.lines else []
    if request.follow:
        return Stream(control.follow_log(backlog))
    return ok(backlog)
