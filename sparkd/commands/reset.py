"""``POST /v1/reset`` — ``sparkctl reset``: close the restart breaker and forget the failures; vLLM starts again
if it should run. Always this node alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Reply
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

__all__ = ["COMMAND", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    from sparkd.supervisor import vocabulary as v  # the daemon's side: a TAB imports this module

    return await act(control, COMMAND, v.ResetRequested, request, forwardable=False)


def render(result: Mapping[str, Any]) -> str:
    return accepted(COMMAND.name, result)


COMMAND = Command("reset", "POST", Request, execute, render, cli=Cli(
    help="Close the restart breaker and forget failures; starts vLLM if it should run."))
