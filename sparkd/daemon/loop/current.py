"""The one owner of the config a running daemon acts on, and of what follows from it (the redactor of its secrets).

Every part reads :meth:`CurrentConfig.__call__` (``current_config()``) when it acts, so a reload changes one object,
not eight: :meth:`replace` swaps the config and tells the parts that derive something of their own from it (the
loop's limits, the log settings, an adapter's copy), each through its own method, in the order they followed.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkd.config import Config
from sparkd.launch.redact import Redactor, redactor_for, use_for_logs

Follower = Callable[[Config], None]


class CurrentConfig:
    def __init__(self, cfg: Config, *, token: str | None = None) -> None:
        self._cfg = cfg
        self.token = token  # the peers' shared secret: never shown either (digests in the status are under it)
        self.redact: Redactor = use_for_logs(redactor_for(cfg, token=token))  # secrets never reach a log
        self._followers: list[Follower] = []

    def __call__(self) -> Config:
        return self._cfg

    def launch_hash(self) -> str:
        return self._cfg.launch_hash()

    def follow(self, follower: Follower) -> None:
        """Call ``follower`` with every config taken on from now on."""
        self._followers.append(follower)

    def replace(self, cfg: Config) -> None:
        """Take on a reloaded config (validated, with the keys a running daemon cannot change kept)."""
        self._cfg = cfg
        self.redact = use_for_logs(redactor_for(cfg, token=self.token))  # a reload may bring new secrets
        for follower in self._followers:
            follower(cfg)
