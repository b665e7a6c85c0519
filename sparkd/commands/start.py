"""``POST /v1/start`` — ``sparkctl start [--wait] [--local]``: start vLLM. Refused while the restart breaker is
open (``reset`` or ``restart`` close it). On a group's worker the head starts the whole group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.act import LOCAL, Request, accepted, act
from sparkd.commands.base import Reply
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

__all__ = ["COMMAND", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    from sparkd.supervisor import vocabulary as v  # the daemon's side: a TAB imports this module

    return await act(control, COMMAND, v.StartRequested, request, forwardable=True)


def render(result: Mapping[str, Any]) -> str:
    return accepted(COMMAND.name, result)


COMMAND = Command("start", "POST", Request, execute, render, cli=Cli(
    help="Start vLLM. Refused while the restart breaker is open (reset or restart close it). On a group's "
         "worker the head starts the whole group.",
    flags=(LOCAL,), waits_for="ready"))
