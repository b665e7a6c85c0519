"""What the host keeps of this node's instance: its record (``instance.json``, what a restarted sparkd adopts) and
its entry in the host's instance registry (:mod:`sparkd.daemon.effects.registry`). Written at a launch or an adoption
(at once, before anything else can happen), the record removed when the instance is stopped, the registry told
"none" once the stop's sweep is done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.effects.registry import InstanceRegistry
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.runtime.base import Instance
from sparkd.state.files import json_state
from sparkd.state.schema import INSTANCE


class InstanceRecord:
    def __init__(self, path: Path, files: StateWriter, registry: InstanceRegistry | None, clock: Clock,
                 log: Logger) -> None:
        self.path = path  # <state_dir>/instance.json (the state directory is fixed until sparkd restarts)
        self.files = files
        self.registry = registry  # the host's instance registry
        self.file = json_state(path, INSTANCE, log=log, clock=clock.wall)

    def read(self) -> dict[str, Any] | None:
        """The record a daemon before this one left (a bad one is set aside, logged, and read as absent)."""
        return self.file.read()

    def write(self, instance: Instance) -> None:
        self.files.write_now(self.path, instance.to_record())
        if self.registry is not None:
            self.registry.update(instance)

    def remove(self) -> None:
        self.files.remove(self.path)

    def released(self) -> None:
        """The stop and its sweep are done: the registry names no instance of this daemon's."""
        if self.registry is not None:
            self.registry.update(None)
