"""``POST /v1/stop`` — ``sparkctl stop [--wait] [--local]``: stop vLLM and keep it stopped, also across daemon
restarts, until ``start`` or ``restart``. On a group's worker the head stops the whole group.
"""

from __future__ import annotations

from typing import Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Control, Reply
from sparkd.supervisor import vocabulary as v

NAME = "stop"
METHOD = "POST"
__all__ = ["METHOD", "NAME", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    return await act(control, NAME, v.StopRequested, request, forwardable=True)


def render(result: dict[str, Any]) -> str:
    return accepted(NAME, result)
