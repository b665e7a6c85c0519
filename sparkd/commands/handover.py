"""``POST /v1/handover`` — ``sparkctl handover``: sparkd exits at once and leaves vLLM running, for the next sparkd
to adopt without a cold start (the package's upgrade uses it; ``systemctl stop sparkd`` still stops vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import NoParams, Reply, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

Request = NoParams


async def execute(control: Control, request: Request) -> Reply:
    why = control.refusal("handover")
    if why:
        return refused(why)
    status = control.status()
    return Reply(True, {"pid": status.get("pid"), "state": status.get("state")}, then=control.handover)


def render(result: Mapping[str, Any]) -> str:
    running = f"vLLM (pid {result['pid']}) keeps running" if result.get("pid") else "no vLLM runs"
    return f"handover: sparkd is exiting; {running} for the next sparkd to adopt"


COMMAND = Command("handover", "POST", Request, execute, render, cli=Cli(
    help="Exit sparkd now and leave vLLM running for the next sparkd to adopt (package upgrades)."),
    root_only=True)  # the control socket, uid 0 (a group member must not leave vLLM unsupervised)
