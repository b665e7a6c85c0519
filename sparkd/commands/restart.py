"""``POST /v1/restart`` — ``sparkctl restart [--wait] [--local]``: stop vLLM, preflight, start it again; also
closes the breaker and forgets the failures. On a group's worker the head restarts the whole group.
"""

from __future__ import annotations

from typing import Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Control, Reply
from sparkd.supervisor import vocabulary as v

NAME = "restart"
METHOD = "POST"
__all__ = ["METHOD", "NAME", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    return await act(control, NAME, v.RestartRequested, request, forwardable=True)


def render(result: dict[str, Any]) -> str:
    return accepted(NAME, result)
