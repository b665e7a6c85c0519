"""What sparkctl says about the rest of ``--config FILE``, of which it reads only what finds the socket.

A typo made while editing the config must not lock the operator out of ``status``, ``stop`` and ``logs``
(:mod:`sparkd.cli.locate`), but it must not pass unseen either: sparkctl says that the file is invalid, and what
is wrong, on stderr, and goes on. Validating costs ~0.3 s (the config's models), more than the whole of
``sparkctl status`` (≤ 150 ms, tests/bench/bench_cli.py), so the daemon's word is taken where it has one: its
status carries the validity of the config file it runs from, re-read when that file changes, and when FILE is
that file the status already shows it ("the config on disk is invalid (...)"), so nothing more is said and
nothing is imported. sparkctl validates FILE itself only when the daemon cannot speak for it: another file than
the daemon's, a daemon that does not answer, a command whose answer carries no status. A FILE that is not even
TOML was already named by :func:`~sparkd.cli.locate.locate`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["config_note", "daemon_speaks_for"]

SHOWN = 2  # problems quoted in the note; check-config lists them all


def daemon_speaks_for(config: Path, daemon_config: Mapping[str, Any] | None) -> bool:
    """The daemon's status (its ``config`` block) judged this very file (same inode, however it was named)."""
    path = (daemon_config or {}).get("path")
    if not isinstance(path, str) or not os.path.isabs(path) or "valid" not in (daemon_config or {}):
        return False
    try:
        return os.path.samefile(config, path)
    except OSError:
        return False


def config_note(config: Path | None, located_note: str | None,
                daemon_config: Mapping[str, Any] | None = None) -> str | None:
    """One line for stderr when ``--config`` names a file that is invalid beyond its socket; None otherwise."""
    if config is None or located_note is not None or daemon_speaks_for(config, daemon_config):
        return None
    from sparkd.config import ConfigError, load_config

    try:
        load_config(config)
    except ConfigError as exc:
        shown = "; ".join(exc.problems[:SHOWN]) + ("; ..." if len(exc.problems) > SHOWN else "")
        return (f"{config} is invalid ({shown}); sparkctl read only its [paths] run_dir. "
                f"`sparkd check-config --config {config}` lists every problem")
    return None
