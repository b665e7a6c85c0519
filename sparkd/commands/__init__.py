"""Control commands, one module each, shared by the daemon (``execute``) and sparkctl (``render``).

``OPERATOR`` are the operator's commands (the unix socket; over TCP, a peer's signed requests). The ranks of a
group talk to each other through their own commands, ``sparkd.commands.rank``.
"""

from __future__ import annotations

from typing import Any

OPERATOR_NAMES = ("status", "start", "stop", "restart", "reset", "reload", "recreate", "handover", "logs", "incidents",
                  "preflight", "weights", "recorder")


def __getattr__(name: str) -> Any:
    """``OPERATOR`` is imported on first use: sparkctl imports one command module, not all of them (and not
    what the daemon side of each needs), to answer in well under 150 ms."""
    if name == "OPERATOR":
        import importlib

        return tuple(importlib.import_module(f"sparkd.commands.{n}") for n in OPERATOR_NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
