"""The config reference (``sparkd config-reference``, ``docs/config.md``), generated from the config models. Pure.

Rules:

1. Every key of every section is one row: its dotted key, type, default, the ``SPARKD_*`` variable that
   overrides it, and its ``description``. A key without a description is an error, not a blank cell.
2. A list of tables (``container.mounts``, ``preflight.assert``) has a row of its own, then one row per key of
   its tables (``container.mounts[].source``); those are set in the file only (no variable).
3. Defaults are shown as TOML would write them; sizes in binary units (``"8 GiB"``); ``unset`` for None;
   ``required`` when there is none; a computed default (the host name) as the description says.
"""

from __future__ import annotations

import enum
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sparkd.config import Config
from sparkd.config.env import ENV_PREFIX, SEPARATOR

__all__ = ["Row", "reference_markdown", "rows"]

SIZE_MARK = "a size such as"  # GuardConfig's size keys say so in their description


@dataclass(frozen=True)
class Row:
    section: str
    key: str
    type: str
    default: str
    variable: str | None
    description: str


class UndocumentedKey(Exception):
    pass


def _members(annotation: Any) -> tuple[list[Any], bool]:
    """The non-None members of an annotation and whether None is allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], False


def type_name(annotation: Any, description: str = "") -> str:
    members, optional = _members(annotation)
    names = [_one_type(m, description) for m in members]
    return " or ".join(names) + (" (optional)" if optional else "")


def _one_type(annotation: Any, description: str) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if SIZE_MARK in description and annotation is int:
        return "size"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    if origin is list:
        inner = args[0] if args else Any
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return "list of tables"
        if get_origin(inner) is Literal:
            return "list of check ids"
        return f"list of {_plural(_one_type(inner, ''))}"
    if origin is dict:
        value = args[1] if len(args) == 2 else Any
        return "table" if value is Any else f"table of {_plural(_one_type(value, ''))}"
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path", Any: "any"}
    return simple.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _plural(name: str) -> str:
    return name if name.endswith("s") or " " in name else name + "s"


def _toml(value: Any, size: bool) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return json.dumps(value.value)
    if size and isinstance(value, int) and value:
        for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value % factor == 0:
                return f'"{value // factor} {unit}"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v, False) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v, False)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, BaseModel):  # a table of a list's default (the acceptance prompts): its keys that are set
        return _toml(value.model_dump(exclude_defaults=True), False)
    return json.dumps(value)


def default_text(field: FieldInfo) -> str:
    size = SIZE_MARK in (field.description or "")
    if field.default_factory is not None:
        factory: Any = field.default_factory
        if isinstance(factory, types.BuiltinFunctionType):  # socket.gethostname: this machine's, not a default
            return "computed (see description)"
        return _toml(factory(), size)
    if field.default is PydanticUndefined:
        return "required"
    return _toml(field.default, size)


def _key_name(name: str, field: FieldInfo) -> str:
    return field.alias if isinstance(field.alias, str) else name


def _section_rows(section: str, model: type[BaseModel], prefix: list[str], in_list: bool) -> Iterator[Row]:
    for name, field in model.model_fields.items():
        key = _key_name(name, field)
        path = [*prefix, key]
        description = (field.description or "").strip()
        dotted = ".".join(path)
        if not description:
            raise UndocumentedKey(f"{dotted}: no description (Field(description=...) in the config models)")
        variable = None if in_list else ENV_PREFIX + SEPARATOR.join(p.upper() for p in path)
        yield Row(section, dotted, type_name(field.annotation, description), default_text(field), variable,
                  description)
        members, _ = _members(field.annotation)
        inner = get_args(members[0])[0] if get_origin(members[0]) is list and get_args(members[0]) else None
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _section_rows(section, inner, [*path[:-1], f"{key}[]"], True)


def rows(root: type[BaseModel] = Config) -> list[Row]:
    """Every key of the config: the top-level values, then section by section."""
    result = list(_top_level(root))
    for name, field in root.model_fields.items():
        members, _ = _members(field.annotation)
        if isinstance(members[0], type) and issubclass(members[0], BaseModel):
            result.extend(_section_rows(name, members[0], [name], False))
    return result


def _top_level(root: type[BaseModel]) -> Iterator[Row]:
    for name, field in root.model_fields.items():
        members, _ = _members(field.annotation)
        if isinstance(members[0], type) and issubclass(members[0], BaseModel):
            continue
        description = (field.description or "").strip()
        if not description:
            raise UndocumentedKey(f"{name}: no description")
        yield Row("", name, type_name(field.annotation, description), default_text(field),
                  ENV_PREFIX + name.upper(), description)


INTRO = """\
# Configuration reference

<!-- Generated by `sparkd config-reference` from the config models (sparkd/config/sections.py,
sparkd/config/supervision.py); the test suite fails when this file and the models differ.
Regenerate: `sparkd config-reference > docs/config.md`. -->

sparkd reads one TOML file, `/etc/sparkd/sparkd.toml` by default (`--config` names another). Check it with
`sparkd check-config`; unknown keys are errors, with the closest key suggested.

**Environment overrides.** Every key can be set from the environment (a systemd drop-in's `Environment=`,
a shell): `SPARKD_<SECTION>__<KEY>`, e.g. `SPARKD_LAUNCH__PORT=8001`. Section and key names match in any
case; the keys of free tables (`launch.env`, `container.env`, `container.labels`, the JSON flag tables) keep
theirs: `SPARKD_LAUNCH__ENV__NCCL_SOCKET_IFNAME=eth0` sets `NCCL_SOCKET_IFNAME`. Sections, tables and lists
take JSON (`SPARKD_LAUNCH__EXTRA_ARGS='["--foo"]'`). An override replaces the file's value (tables merge
key by key). A bad value is reported with the variable's name.

**Profiles.** `[launch] profile` applies a launch profile's values under the section's own keys
(`latency`, `throughput`, `balanced`, `1m-context`; see `config/profiles/`), and the capacity it expects under
`[acceptance]`'s.
"""


def reference_markdown(root: type[BaseModel] = Config) -> str:
    """docs/config.md: an introduction, then one table per section."""
    descriptions = {name: (field.description or "") for name, field in root.model_fields.items()}
    out = [INTRO]
    current: str | None = None
    for row in rows(root):
        if row.section != current:
            current = row.section
            title = f"[{row.section}]" if row.section else "Top level"
            blurb = descriptions[row.section] if row.section else "Keys outside any section."
            out.append(f"\n## {title}\n\n{blurb}\n\n| Key | Type | Default | Environment | Description |\n"
                       "|---|---|---|---|---|")
        variable = f"`{row.variable}`" if row.variable else "(file only)"
        cells = [f"`{row.key}`", row.type, f"`{row.default}`", variable, row.description]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out) + "\n"
