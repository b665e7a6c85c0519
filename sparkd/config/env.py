"""``SPARKD_*`` environment overrides of the config file, each remembering the variable it came from. Pure.

A systemd drop-in (``Environment=SPARKD_LAUNCH__PORT=8001``) or a shell can change one key without editing
the file. Rules:

1. A variable is ``SPARKD_<PART>__<PART>...``; the parts walk the config's keys. Section and key names match
   without regard to case (``SPARKD_SUPERVISOR__LEAVE_RUNNING``). Below a table of free keys (``launch.env``,
   ``container.env``, ``container.labels``, the JSON flag tables) a part is a key of that table and keeps
   its case: ``SPARKD_LAUNCH__ENV__NCCL_SOCKET_IFNAME=eth0`` sets ``NCCL_SOCKET_IFNAME``.
2. A variable without ``__`` whose name is no top-level key is not an override and is ignored (the
   stand-in's ``SPARKD_STANDIN_*`` knobs, the build scripts' ``SPARKD_DEB_*``). Any other unknown part (a
   typo'd section in ``SPARKD_LANCH__PORT``, a key) is an error, with the closest key suggested.
3. A section, a table or a list is given as JSON (``SPARKD_LAUNCH__EXTRA_ARGS='["--foo"]'``); a value as
   its text, which the config model then converts (``8001``, ``true``). A value inside a JSON flag table
   (``SPARKD_LAUNCH__COMPILATION_CONFIG__LEVEL=3``) is read as JSON when it parses, else as text.
4. An override replaces the file's value; tables merge key by key, the override winning. Longer paths
   apply after shorter ones, so ``SPARKD_LAUNCH__PORT`` wins over a ``port`` inside ``SPARKD_LAUNCH``.
5. Every problem names its variable: :class:`OverrideError` carries ``VARIABLE: message`` lines, and
   :func:`variable_for` tells which variable set the value a validation error points at.

The layer is a pydantic-settings source, :class:`sparkd.config.sources.SparkdEnvSource` (an ``EnvSettingsSource``
with prefix ``SPARKD_``, delimiter ``__``, case-sensitive), that :mod:`sparkd.config.layers` stacks over the file and
the profile with ``settings_customise_sources``. Stock ``EnvSettingsSource`` parsing is not enough for sparkd (it
lower-cases free keys such as NCCL names when case-insensitive and ignores ``SPARKD_LAUNCH__PORT`` when
case-sensitive, ignores typos silently and names the field, not the variable, in its errors), so the source
resolves each variable against the model itself (rules 1-3, :func:`parse_overrides`, here: no pydantic-settings
needed to read the variables) and returns the nested tables they set.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from sparkd.config.secretrule import mask_shapes

__all__ = ["ENV_PREFIX", "Override", "OverrideError", "apply_overrides", "parse_overrides", "variable_for"]

ENV_PREFIX = "SPARKD_"
SEPARATOR = "__"


class OverrideError(Exception):
    """Overrides that cannot apply. ``problems`` are ``VARIABLE: message`` lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Override:
    variable: str
    path: tuple[str, ...]  # config keys, e.g. ("launch", "env", "NCCL_SOCKET_IFNAME")
    value: Any


# What a key holds, as far as overriding it is concerned.
_MODEL, _TABLE, _LIST, _VALUE, _ANY = "model", "table", "list", "value", "any"


def _shape(annotation: Any) -> tuple[str, Any]:
    """(kind, detail): a model class, a table's value annotation, or nothing."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return _shape(members[0]) if len(members) == 1 else (_VALUE, None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _MODEL, annotation
    if origin is dict or annotation is dict:
        args = get_args(annotation)
        return _TABLE, (args[1] if len(args) == 2 else Any)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        return _LIST, None
    if annotation is Any:
        return _ANY, None
    return _VALUE, None


def _field_key(model: type[BaseModel], part: str) -> tuple[str, Any] | None:
    """The key a part names in ``model`` (its alias when it has one) and the key's annotation."""
    wanted = part.lower()
    for name, field in model.model_fields.items():
        alias = field.alias if isinstance(field.alias, str) else None
        if wanted in (name, alias):
            return alias or name, field.annotation
    return None


def _suggestion(model: type[BaseModel], part: str) -> str:
    import difflib  # a typo's suggestion: loaded by a variable that has one, not by every daemon

    close = difflib.get_close_matches(part.lower(), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _resolve(variable: str, parts: Sequence[str], root: type[BaseModel]) -> tuple[tuple[str, ...], str, Any]:
    """Walk ``parts`` through the model; returns (path, kind, detail) of the key they name."""
    path: list[str] = []
    kind: str = _MODEL
    detail: Any = root
    for part in parts:
        where = ".".join(path) or "the config"
        if not part:
            raise OverrideError([f"{variable}: an empty part between '__' separators"])
        if kind == _MODEL:
            found = _field_key(detail, part)
            if found is None:
                raise OverrideError([f"{variable}: {where} has no key {part.lower()!r}{_suggestion(detail, part)}"])
            key, annotation = found
            path.append(key)
            kind, detail = _shape(annotation)
        elif kind in (_TABLE, _ANY):
            path.append(part)  # a free key: its case is kept
            kind, detail = _shape(detail) if kind == _TABLE else (_ANY, None)
        elif kind == _LIST:
            raise OverrideError([f"{variable}: {where} is a list; set it whole, as JSON"])
        else:
            raise OverrideError([f"{variable}: {where} is a single value, not a table"])
    return tuple(path), kind, detail


_EXAMPLE = {_MODEL: '{"key": "value"}', _TABLE: '{"NAME": "value"}', _LIST: '["a", "b"]'}


def _value(variable: str, text: str, kind: str, where: str) -> Any:
    if kind == _VALUE:
        return text
    if kind == _ANY:
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return text
    try:
        value = json.loads(text)
    except RecursionError:
        raise OverrideError([f"{variable}: the JSON is nested too deeply"]) from None
    except ValueError as exc:
        raise OverrideError([f"{variable}: {where} takes JSON, e.g. {_EXAMPLE[kind]} ({exc})"]) from None
    wanted = list if kind == _LIST else dict
    if not isinstance(value, wanted):
        noun = "a JSON list" if kind == _LIST else "a JSON object"
        shown = mask_shapes(repr(text[:60]))  # a secret's value is never echoed (sparkd.config.secretrule)
        raise OverrideError([f"{variable}: {where} takes {noun}, e.g. {_EXAMPLE[kind]} (got {shown})"])
    return value


def parse_overrides(env: Mapping[str, str], root: type[BaseModel]) -> list[Override]:
    """Every override in ``env`` for the config model ``root``, shortest path first. Raises
    :class:`OverrideError` listing every bad variable."""
    overrides: list[Override] = []
    problems: list[str] = []
    for variable, text in sorted((name, text) for name, text in env.items() if name.startswith(ENV_PREFIX)):
        parts = variable[len(ENV_PREFIX):].split(SEPARATOR)
        if len(parts) == 1 and _field_key(root, parts[0]) is None:
            continue  # not an override (rule 2)
        try:
            path, kind, _ = _resolve(variable, parts, root)
            overrides.append(Override(variable, path, _value(variable, text or "", kind, ".".join(path))))
        except OverrideError as exc:
            problems.extend(exc.problems)
    if problems:
        raise OverrideError(problems)
    return sorted(overrides, key=lambda o: len(o.path))


def _merge(base: Any, value: Any) -> Any:
    if isinstance(base, dict) and isinstance(value, dict):
        merged = dict(base)
        for key, item in value.items():
            merged[key] = _merge(merged.get(key), item)
        return merged
    return value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """``data`` (the file's tables) with the overrides applied; ``data`` itself is left as it was."""
    result: dict[str, Any] = dict(data)
    for override in overrides:
        *parents, last = override.path
        node = result
        for key in parents:
            child = node.get(key)
            child = dict(child) if isinstance(child, dict) else {}
            node[key] = child
            node = child
        node[last] = _merge(node.get(last), override.value)
    return result


def variable_for(loc: Sequence[str | int], overrides: Sequence[Override]) -> str | None:
    """The variable that set the value at ``loc`` (a validation error's location), if one did: the one with
    the longest path that equals ``loc`` or contains it."""
    key = tuple(str(part) for part in loc)
    owners = [o for o in overrides if key[: len(o.path)] == o.path]
    return max(owners, key=lambda o: len(o.path)).variable if owners else None
