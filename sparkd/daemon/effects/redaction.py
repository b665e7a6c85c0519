"""The redactor of the config in force: every secret it holds or names, and the peers' shared secret. Made once per
config (a reload may bring new secrets) and read when a line, an argv or an incident is written, so no secret
reaches vLLM's log, an incident or ``sparkctl logs``."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from sparkd.config import Config
from sparkd.launch.redact import Redactor, redactor_for


class Redaction:
    def __init__(self, config: Callable[[], Config], token: str | None) -> None:
        self.config = config  # the loop's: the config in force
        self.token = token  # the peers' shared secret: never shown either
        self._made: tuple[weakref.ref[Config], Redactor] | None = None  # keeps no config alive

    def of(self, cfg: Config) -> Redactor:
        if self._made is None or self._made[0]() is not cfg:
            self._made = (weakref.ref(cfg), redactor_for(cfg, token=self.token))
        return self._made[1]

    def __call__(self) -> Redactor:
        return self.of(self.config())
