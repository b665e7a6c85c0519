"""A compose service's ``vllm serve`` command as ``[launch]``, ``[node]`` and ``[cluster]`` keys.

The command (after the entrypoint, if any) may be the words themselves or ``bash -c "..."`` / ``bash -lc``: the
shell string is split as the shell would (after compose's interpolation), a leading ``exec`` and ``NAME=value``
prefixes are dropped (the latter become environment). ``EXECUTABLE serve MODEL`` becomes ``executable``,
``subcommand`` and ``model``. The shapes vLLM's docs and the field use:

- no ``entrypoint:`` and a ``command`` of flags (or a model and flags): the image's ENTRYPOINT runs it; for
  ``vllm/vllm-openai`` that is ``vllm serve``, and any other image is taken to do the same (named in a note);
- ``python3 -m vllm.entrypoints.openai.api_server --model M`` (the older images' ENTRYPOINT, or written out):
  the same server as ``vllm serve M`` with the same flags, carried as that (named in a note);
- ``entrypoint:`` overrides: their words come first, as docker runs them.
 Flags sparkd types become typed keys (JSON flags become TOML tables, dotted
``--flag.key value`` merged in); the rendezvous flags become ``[node]`` rank and role and ``[cluster]`` keys;
every other flag goes to ``extra_args`` verbatim. What cannot be carried (a login shell, several commands in
one shell string) is named.
"""

from __future__ import annotations

import json
import re
import shlex
import types
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from sparkd.cli.compose.interpolate import ComposeError
from sparkd.cli.compose.shapes import words as words_in
from sparkd.config.sections import LaunchConfig
from sparkd.launch.render import JSON_FLAGS, SWITCH_FLAGS, TRISTATE_FLAGS, VALUE_FLAGS, flag

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELLS = ("bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/usr/bin/env")
_RENDEZVOUS = {"--nnodes": ("cluster", "nnodes", int), "--master-addr": ("cluster", "master_addr", str),
               "--master-port": ("cluster", "master_port", int), "--node-rank": ("node", "rank", int)}


def _field_type(name: str) -> type:
    annotation = LaunchConfig.model_fields[name].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation if isinstance(annotation, type) else str


_PYTHON = re.compile(r"^(/\S*/)?python(3(\.\d+)?)?$")
_API_SERVER = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_EXECUTABLES = re.compile(r"^(/\S*/)?(vllm|python(3(\.\d+)?)?|bash|sh|env|exec|\S*entrypoint\S*)$")


def words_of(command: Any, entrypoint: Any, where: str, notes: list[str],
             image: str = "") -> tuple[list[str], dict[str, str]]:
    """(the launch's words, environment set on its command line)."""
    words = words_in(entrypoint, f"{where}.entrypoint") + words_in(command, f"{where}.command")
    if not words:
        raise ComposeError(f"{where}.command: none; sparkd needs the `vllm serve` command")
    if entrypoint is None and _image_runs_serve(words, image):
        which = "vllm/vllm-openai's ENTRYPOINT" if "vllm/vllm-openai" in image else (
            "taken to be `vllm serve`; set [launch] executable if the image's ENTRYPOINT is another program")
        notes.append(f"{where}.command: the image's ENTRYPOINT runs it: `vllm serve` ({which})")
        words = ["vllm", "serve", *words]
    if words[0] in _SHELLS and len(words) >= 3 and words[1].startswith("-") and "c" in words[1]:
        if "l" in words[1]:
            notes.append(f"{where}.command: `{words[0]} {words[1]}` runs a login shell; sparkd runs the launch "
                         "with bash without a login profile (put what the profile sets into [launch.env])")
        text = words[2]
        if re.search(r"(;|&&|\|\||\n(?!\s*$))", text.replace("\\\n", " ")):
            notes.append(f"{where}.command: the shell string runs several commands; only the `serve` one is "
                         "carried")
        words = _last_serve(text, where)
    env = {}
    if words and words[0] == "exec":
        words = words[1:]
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ComposeError(f"{where}.command: only variable assignments; sparkd needs the `vllm serve` command")
    return _api_server_as_serve(words, where, notes), env


def _image_runs_serve(words: list[str], image: str) -> bool:
    """Whether the command is arguments to the image's ENTRYPOINT rather than a program: it starts with a flag,
    or (vllm/vllm-openai) with a model name."""
    if words[0].startswith("-"):
        return True
    return "vllm/vllm-openai" in image and not _EXECUTABLES.match(words[0]) and words[1:2] != ["serve"]


def _api_server_as_serve(words: list[str], where: str, notes: list[str]) -> list[str]:
    if len(words) >= 3 and _PYTHON.match(words[0]) and words[1] == "-m" and words[2] in _API_SERVER:
        notes.append(f"{where}.command: `{' '.join(words[:3])}` is carried as `vllm serve` (the same OpenAI "
                     "server, the same flags)")
        return ["vllm", "serve", *words[3:]]
    return words


def _last_serve(text: str, where: str) -> list[str]:
    try:
        parts = [shlex.split(p) for p in re.split(r";|&&|\|\|", text.replace("\\\n", " ")) if p.strip()]
    except ValueError as exc:
        raise ComposeError(f"{where}.command: cannot split the shell string: {exc}") from None
    parts = [p for p in parts if p]
    serving = [p for p in parts if "serve" in p] or parts[-1:]
    if not serving:
        raise ComposeError(f"{where}.command: the shell string is empty")
    return serving[-1]


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class _Flags:
    """Walks the flags after the model, filling launch, node and cluster keys."""

    def __init__(self, words: Sequence[str], where: str, notes: list[str]) -> None:
        self.words, self.where, self.notes = list(words), where, notes
        self.launch: dict[str, Any] = {}
        self.node: dict[str, Any] = {}
        self.cluster: dict[str, Any] = {}
        self.extra: list[str] = []
        self.headless = False
        self.names = {flag(n): n for n in (*VALUE_FLAGS, *SWITCH_FLAGS, *TRISTATE_FLAGS, *JSON_FLAGS)}

    def take(self, i: int, inline: str | None) -> tuple[str, int]:
        if inline is not None:
            return inline, i + 1
        if i + 1 >= len(self.words):
            raise ComposeError(f"{self.where}.command: {self.words[i]} has no value")
        return self.words[i + 1], i + 2

    def typed(self, name: str, value: str, kind: type) -> Any:
        """``value`` as the key's type (a number, ...); one clear line naming the flag when it is not one."""
        if kind not in (int, float):
            return value
        try:
            return kind(value)
        except ValueError:
            noun = "a whole number" if kind is int else "a number"
            raise ComposeError(f"{self.where}.command: {name} takes {noun} (got {value!r})") from None

    def run(self) -> None:
        i = 0
        while i < len(self.words):
            word = self.words[i]
            if not word.startswith("--"):
                self.extra.append(word)
                i += 1
                continue
            name, eq, inline_value = word.partition("=")
            head, dot, path = name[2:].partition(".")
            name = "--" + head.replace("_", "-") + dot + path  # vLLM's spelling rule: before the first '.' only
            i = self.one(i, name, inline_value if eq else None)

    def one(self, i: int, name: str, inline: str | None) -> int:
        base, dot, path = name.partition(".")
        field = self.names.get(base) or self.names.get("--" + base[5:] if base.startswith("--no-") else "")
        if dot and field in JSON_FLAGS:
            value, i = self.take(i, inline)
            node = self.launch.setdefault(field, {})
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ComposeError(f"{self.where}.command: {name}: {part!r} is set both as a value and as a "
                                       "table")
            node[leaf] = _json_value(value)
            return i
        if name in _RENDEZVOUS:
            section, key, kind = _RENDEZVOUS[name]
            value, i = self.take(i, inline)
            getattr(self, section)[key] = self.typed(name, value, kind)
            return i
        if name == "--headless":
            self.headless = True
            return i + 1
        if field in TRISTATE_FLAGS:
            self.launch[field] = not name.startswith("--no-")
            return i + 1
        if field in SWITCH_FLAGS and not name.startswith("--no-"):
            self.launch[field] = True
            return i + 1
        if field in JSON_FLAGS:
            value, i = self.take(i, inline)
            parsed = _json_value(value)
            if isinstance(parsed, dict):
                self.launch[field] = {**self.launch.get(field, {}), **parsed}
            else:
                self.notes.append(f"{self.where}.command: {name} {value!r} is not a JSON object; kept in "
                                  "extra_args")
                self.extra += [name, value]
            return i
        if field in VALUE_FLAGS:
            value, i = self.take(i, inline)
            self.launch[field] = self.typed(name, value, _field_type(field))
            return i
        self.extra.append(name if inline is None else f"{name}={inline}")
        if inline is None and i + 1 < len(self.words) and not self.words[i + 1].startswith("--"):
            self.extra.append(self.words[i + 1])
            return i + 2
        return i + 1


def launch_keys(words: Sequence[str], where: str, notes: list[str]) -> dict[str, dict[str, Any]]:
    """``{"launch": ..., "node": ..., "cluster": ...}`` from the launch's words."""
    launch: dict[str, Any] = {"executable": words[0]}
    rest = list(words[1:])
    if rest[:1] == ["serve"]:
        launch["subcommand"] = "serve"
        rest = rest[1:]
    else:
        launch["subcommand"] = False  # TOML has no null: false turns the key off
        notes.append(f"{where}.command: {words[0]} is not run as `{words[0]} serve`; its arguments are kept "
                     "as they are in extra_args")
    if rest and not rest[0].startswith("-"):
        launch["model"] = rest.pop(0)
    flags = _Flags(rest, where, notes)
    flags.run()
    launch.update(flags.launch)
    if "model" not in launch:
        model = _pop_model_flag(flags.extra)
        if model is None:
            raise ComposeError(f"{where}.command: no model (neither `serve MODEL` nor --model)")
        launch["model"] = model
    launch["extra_args"] = flags.extra
    node = dict(flags.node)
    nnodes = flags.cluster.get("nnodes", 1)
    if nnodes > 1:
        rank = node.get("rank", 1 if flags.headless else 0)
        node.update(rank=rank, role="worker" if rank > 0 or flags.headless else "head")
    return {"launch": launch, "node": node, "cluster": flags.cluster}


def _pop_model_flag(extra: list[str]) -> str | None:
    """``--model X`` / ``--model=X`` taken out of ``extra``."""
    for i, word in enumerate(extra):
        if word == "--model" and i + 1 < len(extra):
            model = extra[i + 1]
            del extra[i:i + 2]
            return model
        if word.startswith("--model="):
            del extra[i]
            return word.split("=", 1)[1]
    return None
