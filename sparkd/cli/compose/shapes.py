"""What a compose file's values must look like before the import reads them: one clear error naming the key
(``services.vllm.deploy: expected a mapping, got a list``), never an ``AttributeError`` from deep inside."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkd.cli.compose.interpolate import ComposeError

__all__ = ["mapping", "scalar", "sequence", "words"]

_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "a number", float: "a number",
          bool: "true or false", type(None): "nothing"}


def _kind(value: Any) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a mapping (``None`` as an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ComposeError(f"{where}: expected a mapping, got {_kind(value)}")
    return {str(k): v for k, v in value.items()}


def sequence(value: Any, where: str) -> list[Any]:
    """``value`` as a list (``None`` as an empty one)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ComposeError(f"{where}: expected a list, got {_kind(value)}")
    return value


def scalar(value: Any, where: str) -> str:
    """A string, number or boolean as compose writes it into a command or an environment."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | int | float):
        return str(value)
    raise ComposeError(f"{where}: expected a string, got {_kind(value)}")


def words(value: Any, where: str) -> list[str]:
    """A command or entrypoint: a string (split as a shell would) or a list of strings."""
    import shlex

    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ComposeError(f"{where}: cannot split {value[:60]!r}: {exc}") from None
    return [scalar(w, f"{where}[{i}]") for i, w in enumerate(sequence(value, where))]
