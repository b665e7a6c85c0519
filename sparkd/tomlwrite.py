"""A small TOML writer for the configs sparkd writes (``sparkd import-compose``): tables of scalars, lists and
inline tables, in the order given. Strings are written as TOML basic strings with JSON's escapes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(name: str) -> str:
    return name if _BARE.match(name) else json.dumps(name)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dumps(data: Mapping[str, Any], *, header: str = "") -> str:
    """``data``: top-level scalars, then one ``[section]`` per mapping; a mapping inside a section is written
    as a sub-table ``[section.name]`` when SUBTABLES names it, else inline."""
    lines = [header.rstrip("\n")] if header else []
    scalars = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
    lines += [f"{key(k)} = {value(v)}" for k, v in scalars.items()]
    for section, body in data.items():
        if not isinstance(body, Mapping):
            continue
        lines += ["", f"[{key(section)}]"]
        subtables = {k: v for k, v in body.items() if isinstance(v, Mapping) and k in SUBTABLES}
        lines += [f"{key(k)} = {value(v)}" for k, v in body.items() if k not in subtables]
        for name, table in subtables.items():
            if table:
                lines += ["", f"[{key(section)}.{key(name)}]"]
                lines += [f"{key(k)} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


# Mappings written as their own [section.name] tables (long: one line per key reads better than inline).
SUBTABLES = frozenset({"env", "labels"})
