"""``POST /v1/stop`` — ``sparkctl stop [--wait] [--local] [--now]``: stop vLLM and keep it stopped, also across daemon
restarts, until ``start`` or ``restart``. The requests in flight finish first (``[stop] drain_s``); ``--now`` does
not wait for them, and during a drain it cuts the drain short. On a group's worker the head stops the whole group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.act import LOCAL, NOW, accepted, act
from sparkd.commands.act import NowRequest as Request
from sparkd.commands.base import Reply
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

__all__ = ["COMMAND", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    from sparkd.supervisor import vocabulary as v  # the daemon's side: a TAB imports this module

    return await act(control, COMMAND, lambda: v.StopRequested(now=request.now), request, forwardable=True)


def render(result: Mapping[str, Any]) -> str:
    return accepted(COMMAND.name, result)


COMMAND = Command("stop", "POST", Request, execute, render, cli=Cli(
    help="Stop vLLM and keep it stopped, also across daemon restarts, until start or restart. The requests in "
         "flight finish first ([stop] drain_s); --now does not wait for them (during a drain: cuts it short). On a "
         "group's worker the head stops the whole group.",
    flags=(LOCAL, NOW), waits_for="stopped"))
