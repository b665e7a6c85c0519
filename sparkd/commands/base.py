"""What every control command shares: its reply and its request parsing (the daemon surface it runs against is
:mod:`sparkd.commands.port`).

A command is a :class:`~sparkd.commands.command.Command` (its shape: :mod:`sparkd.commands.command`); an
operator's is one module (circus's way) whose ``COMMAND`` names its route (``/v1/<name>``), its ``Request`` (with
``from_params``/``to_params``: the parameters both sides agree on), its ``execute(control, request)`` on the
daemon's side and its ``render``/``exit_code`` on sparkctl's. Its docstring is its protocol. Every answer is one
envelope: ``{"ok": true, "result": …}`` or ``{"ok": false, "error": "…", "result": <status or null>}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

Method = Literal["GET", "POST"]


class BadRequest(ValueError):
    """A request the daemon cannot parse: 400, naming the parameter."""


# Plain classes, not dataclasses: sparkctl imports these modules on a TAB, and a dataclass costs ~1 ms to make.
class Value:
    """A frozen-dataclass stand-in for a small request: equal (and hashed) by its class and its ``__slots__``."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Value) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class NoParams(Value):
    """The request of a command that takes no parameters."""

    __slots__ = ()

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> NoParams:
        return cls()

    def to_params(self) -> dict[str, str]:
        return {}


class Reply:
    """A command's answer: ``then`` runs once the answer is sent (a hand-over exits after answering)."""

    __slots__ = ("code", "error", "ok", "result", "then")

    def __init__(self, ok: bool, result: Any = None, error: str | None = None, code: int = 200,
                 then: Callable[[], None] | None = None) -> None:
        self.ok, self.result, self.error, self.code, self.then = ok, result, error, code, then

    def envelope(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "result": self.result}
        return {"ok": False, "error": self.error, "result": self.result}


class Stream:
    """A streamed text answer (``sparkctl logs -f``)."""

    __slots__ = ("lines",)

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.lines = lines


def ok(result: Any = None) -> Reply:
    return Reply(True, result)


def refused(error: str, result: Any = None, code: int = 409) -> Reply:
    return Reply(False, result, error, code)


def flag(params: Mapping[str, str], name: str) -> bool:
    value = params.get(name, "")
    if value not in ("", "0", "1", "true", "false", "yes", "no"):
        raise BadRequest(f"{name}: expected 1 or 0, got {value!r}")
    return value in ("1", "true", "yes")


def number(params: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a whole number, got {raw!r}") from None
    if value < minimum:
        raise BadRequest(f"{name}: must be at least {minimum}, got {value}")
    return value

