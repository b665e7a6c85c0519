"""Compose's variable interpolation: ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?message}``, ``${VAR?message}``, ``${VAR:+alt}``, ``${VAR+alt}`` (defaults may nest), ``$$`` for ``$``.

As ``docker compose`` does: values come from the shell environment, over the project's ``.env`` file; a required
variable that is unset (``:?``) is an error naming it and the place it was needed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./:@-]+")


def key_path(where: str, key: object) -> str:
    """``where`` with one more key, as the errors and notes name it: ``where.key``, or ``where['a key']`` where the
    key holds anything else (a space, a newline: the message stays one line)."""
    name = str(key)
    step = f".{name}" if _PLAIN_KEY.fullmatch(name) else f"[{name!r}]"
    return f"{where}{step}" if where else (name if step.startswith(".") else step)


class ComposeError(Exception):
    """The compose file cannot be converted; the message names the key, variable or construct."""


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional ``export``, quotes stripped), as compose reads ``.env``."""
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # a NUL in the name, or not UTF-8
        raise ComposeError(f"{str(path)!r}: cannot read: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not eq or not _NAME.fullmatch(name):
            raise ComposeError(f"{path}:{number}: not a KEY=VALUE line: {line[:60]!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].rstrip()
        values[name] = value
    return values


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``${`` whose body starts at ``start``."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ComposeError(f"unclosed '${{' in {text!r}")


def _braced(body: str, env: Mapping[str, str], where: str) -> str:
    m = _NAME.match(body)
    if m is None:
        raise ComposeError(f"{where}: invalid interpolation '${{{body}}}'")
    name, rest = m.group(0), body[m.end():]
    value = env.get(name)
    for op in (":-", "-", ":?", "?", ":+", "+"):
        if rest.startswith(op):
            arg = substitute(rest[len(op):], env, where)
            unset = value is None or (op.startswith(":") and value == "")
            if op in (":-", "-"):
                return arg if unset else str(value)
            if op in (":?", "?"):
                if unset:
                    raise ComposeError(f"{where}: required variable {name} is missing a value: {arg}")
                return str(value)
            return "" if unset else arg
    if rest:
        raise ComposeError(f"{where}: invalid interpolation '${{{body}}}'")
    return value or ""


def substitute(text: str, env: Mapping[str, str], where: str) -> str:
    out = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = _closing(text, i + 2)
            out.append(_braced(text[i + 2:end], env, where))
            i = end + 1
        elif text[i] == "$" and (m := _NAME.match(text, i + 1)):
            out.append(env.get(m.group(0), ""))
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def interpolate(value: Any, env: Mapping[str, str], where: str = "") -> Any:
    """Every string in ``value`` (nested lists and mappings) interpolated; ``where`` names the key for errors."""
    if isinstance(value, str):
        return substitute(value, env, where)
    if isinstance(value, list):
        return [interpolate(v, env, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: interpolate(v, env, key_path(where, k)) for k, v in value.items()}
    return value
