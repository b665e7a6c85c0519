"""Control commands, one module each, shared by the daemon (``execute``) and sparkctl (``render``): the registry.

``OPERATOR_NAMES`` are the operator's commands (the unix socket; over TCP, a peer's signed requests): a new one is
its module (whose ``COMMAND`` is a :class:`~sparkd.commands.command.Command`) and its name here; the server serves
it and sparkctl offers it (when it has a ``Cli``) from this list. The ranks of a group talk to each other through
their own commands, ``sparkd.commands.rank.RANK``, of the same shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkd.commands.command import Command

OPERATOR_NAMES = ("status", "start", "stop", "restart", "reset", "reload", "recreate", "handover", "logs", "incidents",
                  "preflight", "weights", "recorder", "accept")


def operator_command(name: str) -> Command[Any, Any]:
    """The command ``name`` of the registry, its module imported now: sparkctl imports the one it runs, not all
    of them (and not what the daemon side of each needs), to answer in well under 150 ms."""
    import importlib

    if name not in OPERATOR_NAMES:
        raise KeyError(name)
    command: Command[Any, Any] = importlib.import_module(f"sparkd.commands.{name}").COMMAND
    return command


def operator() -> tuple[Command[Any, Any], ...]:
    """Every operator's command, in the registry's order."""
    return tuple(operator_command(name) for name in OPERATOR_NAMES)
