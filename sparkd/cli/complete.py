"""TAB completion of values, for click's ``shell_complete=``: launch profile names (``sparkd check-config
--profile <TAB>``) and incident ids (``sparkctl incidents <TAB>``).

A completion runs on every TAB, so it answers within the CLI's 150 ms (tests/bench/bench_cli.py): the profile
names are the files beside :mod:`sparkd.config.profiles`; the incident ids come from the daemon (found as every sparkctl
call finds it, from the ``--socket``/``--config`` already typed) with a short timeout. A daemon that does not
answer, or anything else that goes wrong, completes nothing: a TAB never prints an error or a traceback.
"""

from __future__ import annotations

from typing import Any

from click.shell_completion import CompletionItem

__all__ = ["incident_ids", "profile_names"]

TIMEOUT_S = 1.0  # a TAB waits this long at most for the daemon
HELP_CHARS = 70  # zsh and fish show each id's class and sentence beside it


def profile_names(ctx: Any, param: Any, incomplete: str) -> list[CompletionItem]:
    from sparkd.config.profiles import profile_names as names

    return [CompletionItem(name) for name in names() if name.startswith(incomplete)]


def incident_ids(ctx: Any, param: Any, incomplete: str) -> list[CompletionItem]:
    """The daemon's incidents whose id starts with ``incomplete``, newest first (as ``sparkctl incidents`` lists)."""
    from pathlib import Path

    from sparkd.api.client import ActionRefused, ControlClient, DaemonUnreachable
    from sparkd.cli.locate import locate
    from sparkd.commands import incidents

    obj = ctx.obj  # sparkctl's Ctx: the --socket/--config typed before or after the subcommand
    located = locate(getattr(obj, "socket", None), getattr(obj, "config", None))
    try:
        items = ControlClient(located.socket, timeout_s=TIMEOUT_S).call(incidents.COMMAND, incidents.Request())
        found = []
        for item in items:
            name = Path(item["path"]).name
            if name.startswith(incomplete):
                found.append(CompletionItem(name, help=f"{item['class']}: {item['message']}"[:HELP_CHARS]))
        return found
    except (DaemonUnreachable, ActionRefused, OSError, ValueError, KeyError, TypeError):
        return []
