"""Control commands, one module each, shared by the daemon (``execute``) and sparkctl (``render``).

``OPERATOR`` are the operator's commands (the unix socket; over TCP with the bearer token). The ranks of a
group talk to each other through their own commands, ``sparkd.commands.rank``.
"""

from __future__ import annotations

from sparkd.commands import (
    handover,
    incidents,
    logs,
    preflight,
    recreate,
    reload,
    reset,
    restart,
    start,
    status,
    stop,
    weights,
)

OPERATOR = (status, start, stop, restart, reset, reload, recreate, handover, logs, incidents, preflight, weights)
