"""A restart breaker opened by a config error closes by itself once the config it failed on has changed.

``sparkctl reset`` is for a breaker whose cause is gone; for a rejected configuration the cause is the config,
so fixing it is the operator's reset: when the breaker opens on a ``config_error``, the launch hash of the config
it failed on is kept in ``<state_dir>/breaker-config.json``; when sparkd starts, or a reload takes on a config
whose launch differs, while the breaker is still open, sparkd closes it (as ``reset`` does: vLLM starts again if
it should run) and the status says so. An unchanged config leaves it open: retrying cannot help.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkd.config import Config
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.logs import Logger
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.states import Machine, State

__all__ = ["ConfigBreaker"]

CLOSES_ON_CHANGE = frozenset({FailureClass.config_error})


class ConfigBreaker:
    def __init__(self, path: Path, config: Callable[[], Config], post: Callable[[v.Observation], None],
                 files: Any, log: Logger) -> None:
        self.path, self.config, self.post, self.files, self.log = path, config, post, files, log
        self.failed_on: str | None = self._read()
        self.note: str | None = None  # what the status says about it

    def launch_hash(self) -> str:
        return self.config().launch_hash()

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """The machine changed (the breaker opened or closed), or a reload took on a config (its launch may
        differ from the one the breaker failed on)."""
        if after.machine is not before.machine:
            self.on_transition(before.machine, after.machine)
        if after.config is not before.config:
            self.check(after.machine)

    def _read(self) -> str | None:
        try:
            data = json.loads(self.path.read_text())
            return str(data["launch_hash"]) if isinstance(data, dict) and data.get("launch_hash") else None
        except (OSError, ValueError, KeyError, RecursionError):
            return None

    def on_transition(self, before: Machine, after: Machine) -> None:
        if after.state is not State.failed:
            if before.state is State.failed:  # closed (reset, restart, or by us): nothing to wait for
                self.failed_on = None
                self.files.remove(self.path)
            return
        if before.state is State.failed:
            return
        failure = after.last_failure
        # Into failed from adopting: the breaker a previous daemon left open (restored); from anywhere else: a
        # failure just opened it.
        if before.state is not State.adopting and failure is not None and failure.cls in CLOSES_ON_CHANGE:
            self.failed_on = self.launch_hash()
            self.note = None
            self.files.put(self.path, {"launch_hash": self.failed_on, "class": failure.cls.value})
        else:
            self.check(after)

    def check(self, machine: Machine) -> None:
        """At a daemon start (once the breaker state is known) and after a reload: close the breaker when the
        config it failed on has changed."""
        if machine.state is not State.failed or self.failed_on is None:
            return
        now = self.launch_hash()
        if now == self.failed_on:
            self.note = (f"the breaker closes by itself once the config's launch changes (it failed on launch "
                         f"{self.failed_on}): fix it, then `sparkctl reload` or restart sparkd")
            return
        self.note = (f"the breaker closed by itself: the config it failed on (launch {self.failed_on}) changed "
                     f"(now launch {now})")
        self.log.warning("breaker_closed_config_changed", failed_on=self.failed_on, now=now)
        self.failed_on = None
        self.post(v.ResetRequested())
