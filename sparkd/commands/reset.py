"""``POST /v1/reset`` — ``sparkctl reset``: close the restart breaker and forget the failures; vLLM starts again
if it should run. Always this node alone.
"""

from __future__ import annotations

from typing import Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Control, Reply
from sparkd.supervisor import vocabulary as v

NAME = "reset"
METHOD = "POST"
__all__ = ["METHOD", "NAME", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    return await act(control, NAME, v.ResetRequested, request, forwardable=False)


def render(result: dict[str, Any]) -> str:
    return accepted(NAME, result)
