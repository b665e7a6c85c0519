"""``POST /v1/start`` — ``sparkctl start [--wait] [--local]``: start vLLM. Refused while the restart breaker is
open (``reset`` or ``restart`` close it). On a group's worker the head starts the whole group.
"""

from __future__ import annotations

from typing import Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Control, Reply
from sparkd.supervisor import vocabulary as v

NAME = "start"
METHOD = "POST"
__all__ = ["METHOD", "NAME", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    return await act(control, NAME, v.StartRequested, request, forwardable=True)


def render(result: dict[str, Any]) -> str:
    return accepted(NAME, result)
