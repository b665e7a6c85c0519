"""This daemon's registration in the host's instance registry (:mod:`sparkd.instances`), kept current.

Written at start, at every launch or adoption and after every stop (the launch then reads as none), rewritten
every minute (another instance's unit may have cleared /run/sparkd), removed at exit. A write that fails is
logged once per episode and never stops the daemon: other instances then only lack the protection by marker
(a live tree is a neighbour by the orphan rule anyway).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkd import instances
from sparkd.config import Config
from sparkd.runtime.base import Instance


class InstanceRegistry:
    def __init__(self, cfg: Config, config_path: Path | None, log: Any) -> None:
        self.cfg = cfg
        self.log = log
        self.base = instances.this_daemon(cfg.paths.state_dir, config_path, cfg.node.name)
        self.current = self.base
        self.problem: str | None = None

    @property
    def folder(self) -> Path:
        return self.cfg.paths.instances_dir

    def update(self, instance: Instance | None) -> None:
        """Register ``instance`` as this daemon's live launch (None: nothing launched now)."""
        self.current = self.base if instance is None else replace(
            self.base, launch_pid=instance.pid, launch_start=instance.create_time,
            marker=(instance.identity or {}).get("marker"), container=(instance.extra or {}).get("container"))
        self.write()

    def write(self) -> None:
        try:
            instances.write(self.folder, self.current)
        except OSError as exc:
            problem = f"{exc.strerror or exc}"
            if problem != self.problem:
                self.log.warning("registration_failed", folder=str(self.folder), problem=problem)
            self.problem = problem
            return
        if self.problem is not None:
            self.log.info("registration_recovered", folder=str(self.folder))
        self.problem = None

    def remove(self) -> None:
        instances.remove(self.folder, self.cfg.paths.state_dir, self.base.daemon_pid)
