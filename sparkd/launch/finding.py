"""One finding of the lint (:mod:`sparkd.launch.lint`): a rule id, its level, the config key it is about and what
to do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Level(StrEnum):
    error = "error"
    warning = "warning"


@dataclass(frozen=True)
class Finding:
    rule: str
    level: Level
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.value}: {self.key}: {self.message} [{self.rule}]"
