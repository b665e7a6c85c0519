"""This daemon's registration in the host's instance registry (:mod:`sparkd.preflight.instances`), kept current.

Written at start, at every launch or adoption and after every stop (the launch then reads as none), rewritten
every minute (another instance's unit may have cleared /run/sparkd), removed at exit. It goes into ``[paths]
instances_dir``; where this daemon may not write that (a user's ``make run`` beside root's ``/run/sparkd``), into
its user's runtime folder (``$XDG_RUNTIME_DIR/sparkd/instances``), which every instance reads too: one note says
so, once. A write that fails everywhere is one warning per episode and never stops the daemon: other instances
then only lack the protection by marker (a live tree is a neighbour by the orphan rule anyway).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sparkd.config import Config
from sparkd.preflight import instances
from sparkd.runtime.base import Instance

if TYPE_CHECKING:
    from sparkd.host.logs import Logger


class InstanceRegistry:
    def __init__(self, config: Callable[[], Config], config_path: Path | None, log: Logger,
                 env: Mapping[str, str] | None = None) -> None:
        self.config = config  # the config in force: the folder a reload names is used from the next write
        cfg = config()
        self.log = log
        self.env = os.environ if env is None else env
        self.base = instances.this_daemon(cfg.paths.state_dir, config_path, cfg.node.name)
        self.current = self.base
        self.problem: str | None = None
        self.where: Path | None = None  # the folder the registration is in now

    @property
    def cfg(self) -> Config:
        return self.config()

    @property
    def folder(self) -> Path:
        return self.cfg.paths.instances_dir

    def folders(self) -> list[Path]:
        """Where to write, in order: the configured folder, then this user's runtime folder."""
        user = instances.user_folder(self.env)
        return [self.folder, *([user] if user is not None and user != self.folder else [])]

    def update(self, instance: Instance | None) -> None:
        """Register ``instance`` as this daemon's live launch (None: nothing launched now)."""
        self.current = self.base if instance is None else replace(
            self.base, launch_pid=instance.pid, launch_start=instance.create_time,
            marker=(instance.identity or {}).get("marker"), container=(instance.extra or {}).get("container"))
        self.write()

    def write(self) -> None:
        problems: list[str] = []
        for folder in self.folders():
            try:
                instances.write(folder, self.current)
            except OSError as exc:
                problems.append(f"{exc.strerror or exc}")
                continue
            self._written(folder, problems)
            return
        problem = "; ".join(problems)
        if problem != self.problem:
            self.log.warning("registration_failed", folder=str(self.folder), problem=problem,
                             hint="other sparkd instances on this host cannot see this one's launch; set "
                                  "XDG_RUNTIME_DIR, or [paths] instances_dir to a folder of this user's")
        self.problem, self.where = problem, None

    def _written(self, folder: Path, problems: list[str]) -> None:
        moved = folder != self.where
        if moved and self.where is not None:
            instances.remove(self.where, self.cfg.paths.state_dir, self.base.daemon_pid)
        if moved and folder != self.folder:
            self.log.info("registration_in_user_folder", folder=str(folder), configured=str(self.folder),
                          because=problems[0] if problems else "",
                          note="this user's other sparkd instances and root's read it there")
        elif self.problem is not None:
            self.log.info("registration_recovered", folder=str(folder))
        self.problem, self.where = None, folder

    def remove(self) -> None:
        if self.where is not None:
            instances.remove(self.where, self.cfg.paths.state_dir, self.base.daemon_pid)
