"""What a user's own launch script (``[launch] script``, the migration path) says about the launch. Pure.

sparkd does not render the argv in script mode, but the checks it runs on a rendered launch still matter: the
rank, ``--headless`` on a worker, the memory utilisation preflight must plan for, and the environment the script
exports (``VLLM_WORKER_MULTIPROC_METHOD=fork`` is as fatal there as anywhere). This reads them from the text.

Rules: continuation lines are joined; comments are dropped; the launch command is the last line with ``serve``
as a word (after an optional ``exec`` and ``NAME=value`` prefixes, which count as exports); ``export NAME=value``
lines are exports. A word that is a shell expansion (``${NODE_RANK}``) is kept as written: it is no literal, so
no rule can judge it. The per-node arguments sparkd appends reach the command only where it passes ``"$@"``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class ScriptFacts:
    command: tuple[str, ...] = ()  # the serve command's words, with sparkd's appended arguments where "$@" is
    exports: dict[str, str] = field(default_factory=dict)

    def value(self, flag: str) -> str | None:
        """The last value given to ``flag`` (``--flag V`` or ``--flag=V``), or None."""
        found = None
        for i, word in enumerate(self.command):
            if word == flag and i + 1 < len(self.command):
                found = self.command[i + 1]
            elif word.startswith(flag + "="):
                found = word.split("=", 1)[1]
        return found

    def mentions(self, flag: str) -> bool:
        """``flag`` appears, literally or inside an expansion such as ``${HEADLESS:+--headless}``."""
        return any(flag in word for word in self.command)

    def literal_int(self, flag: str) -> int | None:
        value = self.value(flag)
        return int(value) if value is not None and value.isdigit() else None

    def literal_float(self, flag: str) -> float | None:
        value = self.value(flag)
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


def _lines(text: str) -> list[str]:
    return [line for line in re.sub(r"\\\r?\n", " ", text).splitlines() if line.strip()]


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: not a line this reader can judge
        return []


def script_facts(text: str, appended: Sequence[str] = ()) -> ScriptFacts:
    """The launch command and exports of a launch script's ``text``; ``appended``: what sparkd passes to it."""
    command: list[str] = []
    exports: dict[str, str] = {}
    for line in _lines(text):
        words = _words(line)
        if words[:1] == ["export"]:
            exports.update(_assignments(words[1:]))
            continue
        if "serve" not in words:
            continue
        while words and (words[0] == "exec" or _ASSIGNMENT.match(words[0])):
            exports.update(_assignments(words[:1]))
            words = words[1:]
        command = words
    if "$@" in command:
        at = command.index("$@")
        command[at:at + 1] = list(appended)
    return ScriptFacts(tuple(command), exports)


def _assignments(words: Sequence[str]) -> dict[str, str]:
    return dict(word.split("=", 1) for word in words if _ASSIGNMENT.match(word))
