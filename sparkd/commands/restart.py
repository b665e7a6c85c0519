"""``POST /v1/restart`` — ``sparkctl restart [--wait] [--local] [--now]``: stop vLLM (the requests in flight finish
first, ``[stop] drain_s``; ``--now`` does not wait for them), preflight, start it again; also closes the breaker and
forgets the failures. It reloads the config on disk first, so it always launches the
validated config (an invalid one refuses the restart). On a group's worker the head restarts the whole group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.act import LOCAL, NOW, accepted, act
from sparkd.commands.act import NowRequest as Request
from sparkd.commands.base import Reply, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

__all__ = ["COMMAND", "Request", "execute", "render"]


async def execute(control: Control, request: Request) -> Reply:
    from sparkd.supervisor import vocabulary as v  # the daemon's side: a TAB imports this module

    if not (control.worker and not request.local):  # on a worker the head restarts the group, and reloads
        report = await control.reload()
        problems = report.problems if not report.ok else []
        if report.ok and control.group is not None and not request.local:
            problems = await control.group.reload_workers()
        if problems:
            return refused("the config on disk is invalid, so sparkd will not restart with it:\n  "
                           + "\n  ".join(problems), control.status())
    return await act(control, COMMAND, lambda: v.RestartRequested(now=request.now), request, forwardable=True)


def render(result: Mapping[str, Any]) -> str:
    return accepted(COMMAND.name, result)


COMMAND = Command("restart", "POST", Request, execute, render, cli=Cli(
    help="Stop vLLM (the requests in flight finish first; --now does not wait for them), preflight, start it "
         "again; also closes the breaker and forgets the failures. It reloads the config on disk first (an invalid "
         "one refuses the restart).",
    flags=(LOCAL, NOW), waits_for="ready"))
