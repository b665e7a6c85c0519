"""Config reload (``sparkctl reload``, SIGHUP, the unit's ExecReload=): read and validate the config on disk.

Invalid: nothing changes; the problems are reported (and logged), the running vLLM is untouched. Valid: what
changed is reported — the rendered argv and environment, and every other key — and the daemon takes it on at
once (health, guard floors, restart policy, timeouts); launch settings apply at the next start, so ``sparkctl
restart`` launches exactly the validated config on disk (restart reloads first). Keys a running daemon cannot
take on (``sparkd.launch.diff.NEEDS_RESTART``) keep their old value until sparkd restarts, and the report says so.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sparkd.config import Config, ConfigError, load_config
from sparkd.host.logs import Logger
from sparkd.host.rootfiles import config_problem, launch_program_refusal, trusted_files_problem
from sparkd.launch.diff import NEEDS_RESTART, launch_changes, needs_restart, setting_changes
from sparkd.launch.lint import errors, lint
from sparkd.launch.redact import Redactor
from sparkd.launch.render import secret_values
from sparkd.supervisor import vocabulary as v


@dataclass(frozen=True)
class ReloadReport:
    ok: bool
    problems: list[str] = field(default_factory=list)  # why the config on disk was refused
    launch: list[str] = field(default_factory=list)  # argv/env changes: at the next start
    settings: list[str] = field(default_factory=list)  # applied now
    at_daemon_restart: list[str] = field(default_factory=list)  # kept as they were until sparkd restarts

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems, "launch": self.launch, "settings": self.settings,
                "at_daemon_restart": self.at_daemon_restart}


def read_valid(path: Path) -> Config | list[str]:
    """The config at ``path`` if only root may change it and what it names (:mod:`sparkd.host.rootfiles`), it loads
    and lints clean, else the problems, each naming its key or path."""
    untrusted = config_problem(path)
    if untrusted is not None:
        return [untrusted]
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        return [f"{exc.source}: {problem}" for problem in exc.problems]
    bad = [str(finding) for finding in errors(lint(cfg))]
    bad += [why for why in (trusted_files_problem(cfg), launch_program_refusal(cfg)[0]) if why is not None]
    return [f"{path}: {problem}" for problem in bad] if bad else cfg


def keep_fixed(old: Config, new: Config) -> Config:
    """``new`` with the keys a running daemon cannot take on (``NEEDS_RESTART``) kept as in ``old``."""
    top: dict[str, Any] = {}
    fields: dict[str, dict[str, Any]] = {}
    for key in NEEDS_RESTART:
        section, _, name = key.partition(".")
        if name:
            fields.setdefault(section, {})[name] = getattr(getattr(old, section), name)
        else:  # a whole section ("paths.") or a top-level key ("runtime")
            top[section] = getattr(old, section)
    for section, kept in fields.items():
        top[section] = getattr(new, section).model_copy(update=kept)
    return new.model_copy(update=top)


class Reloader:
    """``current``: the config in force (the loop's); ``submit``: the loop's queue, waited on until applied — a
    reloaded config is an observation (``ConfigReplaced``), taken in order with everything else."""

    def __init__(self, path: Path | None, current: Callable[[], Config],
                 submit: Callable[[v.Posted], Awaitable[None]], log: Logger) -> None:
        self.path = path
        self.current = current
        self.submit = submit
        self.log = log
        self._disk: tuple[tuple[int, int, int], Config | list[str]] | None = None

    async def reload(self) -> ReloadReport:
        if self.path is None:  # built in-process from a config object: there is nothing on disk to take on
            return ReloadReport(True)
        read = await anyio.to_thread.run_sync(read_valid, self.path)
        if isinstance(read, list):
            self.log.error("config_reload_refused", path=str(self.path), problems=read)
            return ReloadReport(False, read)
        old = self.current()
        changes = setting_changes(old, read)
        # Secrets of either config never reach the report (an api key inside extra_args, say).
        redact = Redactor([*secret_values(old), *secret_values(read)],
                          names={*old.launch.secret_env, *read.launch.secret_env})
        fixed = [redact(f"{key}: {a!r} → {b!r}") for key, a, b in changes if needs_restart(key)]
        now = [redact(f"{key}: {a!r} → {b!r}") for key, a, b in changes if not needs_restart(key)]
        taken = keep_fixed(old, read)
        launch = [redact(line) for line in launch_changes(old, taken)]  # what the next start launches
        report = ReloadReport(True, launch=launch, settings=now, at_daemon_restart=fixed)
        await self.submit(v.ConfigReplaced(taken))
        self.log.info("config_reloaded", path=str(self.path), launch=report.launch, settings=report.settings,
                      at_daemon_restart=report.at_daemon_restart)
        return report

    def on_disk(self) -> Config | list[str] | None:
        """The config on disk now (re-read only when the file changed), or its problems; None without a file."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return [f"{self.path}: {exc.strerror}"]
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._disk is None or self._disk[0] != key:
            self._disk = (key, read_valid(self.path))
        return self._disk[1]
