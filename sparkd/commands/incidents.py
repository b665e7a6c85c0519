"""``GET /v1/incidents[?id=ID]`` — ``sparkctl incidents [ID]``: failures with their class, sentence and evidence
folder, newest first; or one (an id, or the start of one) with its log tail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import Reply, ok, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control


@dataclass(frozen=True)
class Request:
    id: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Request:
        return cls(id=params.get("id") or None)

    def to_params(self) -> dict[str, str]:
        return {"id": self.id} if self.id else {}


async def execute(control: Control, request: Request) -> Reply:
    # The daemon's side only: sparkctl imports this module for a TAB on an incident id, within its 150 ms.
    import anyio

    from sparkd.state.incidents import list_incidents, log_tail_of

    items = await anyio.to_thread.run_sync(list_incidents, control.incidents_root)
    if request.id is None:
        return ok(items)
    for item in items:
        name = Path(item["path"]).name
        if name == request.id or name.startswith(request.id):
            tail = await anyio.to_thread.run_sync(log_tail_of, Path(item["path"]))
            return ok({**item, "log_tail": tail})
    return refused(f"no incident {request.id!r}", code=404)


def render(result: Any) -> str:
    if isinstance(result, dict):
        return f"{result['at_utc']}  {result['class']}: {result['message']}\n{result['path']}\n\n{result['log_tail']}"
    return "\n".join(f"{Path(item['path']).name}  {item['class']:<20} {item['message']}" for item in result)


COMMAND = Command("incidents", "GET", Request, execute, render, cli=Cli(
    help="Failures with their class, sentence and evidence folder, newest first; or one with its log tail."))
