"""``POST /v1/reload`` — ``sparkctl reload`` (also SIGHUP and the unit's ExecReload=): read and validate the config
on disk. Invalid: nothing changes and the problems are the answer (exit 1). Valid: the changes are the answer —
the rendered argv and environment (applied at the next start; ``sparkctl restart`` applies them now) and every
other key (applied at once), with the few keys that wait for a restart of sparkd itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.base import NoParams, Reply, ok, refused
from sparkd.commands.command import Cli, Command

if TYPE_CHECKING:
    from sparkd.commands.port import Control

Request = NoParams


async def execute(control: Control, request: Request) -> Reply:
    report = await control.reload()
    if not report.ok:
        return refused("the config on disk is invalid, nothing changed:\n  " + "\n  ".join(report.problems),
                       report.to_json())
    return ok(report.to_json())


def render(result: Mapping[str, Any]) -> str:
    lines = ["reload: the config on disk is valid"]
    if not (result["launch"] or result["settings"] or result["at_daemon_restart"]):
        lines.append("  nothing changed")
    for change in result["launch"]:
        lines.append(f"  launch (at the next start; `sparkctl restart` applies it now): {change}")
    for change in result["settings"]:
        lines.append(f"  applied now: {change}")
    for change in result["at_daemon_restart"]:
        lines.append(f"  when sparkd restarts: {change}")
    return "\n".join(lines)


COMMAND = Command("reload", "POST", Request, execute, render, cli=Cli(
    help="Read and validate the config on disk; show what changed. Exit 1 (nothing changed) when it is invalid.",
    timeout_s=60))
