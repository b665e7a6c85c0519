"""``POST /v1/restart`` — ``sparkctl restart [--wait] [--local]``: stop vLLM, preflight, start it again; also
closes the breaker and forgets the failures. It reloads the config on disk first, so it always launches the
validated config (an invalid one refuses the restart). On a group's worker the head restarts the whole group.
"""

from __future__ import annotations

from typing import Any

from sparkd.commands.act import Request, accepted, act
from sparkd.commands.base import Control, Reply, refused
from sparkd.supervisor import vocabulary as v

NAME = "restart"
METHOD = "POST"
__all__ = ["METHOD", "NAME", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    if not (control.worker and not request.local):  # on a worker the head restarts the group, and reloads
        report = await control.reload()
        problems = report.problems if not report.ok else []
        if report.ok and control.group is not None and not request.local:
            problems = await control.group.reload_workers()
        if problems:
            return refused("the config on disk is invalid, so sparkd will not restart with it:\n  "
                           + "\n  ".join(problems), control.status())
    return await act(control, NAME, v.RestartRequested, request, forwardable=True)


def render(result: dict[str, Any]) -> str:
    return accepted(NAME, result)
