"""``sparkd import-compose``: a docker-compose service (field reports 001 and 004 deploy with compose) as a sparkd
config that passes ``check-config``.

The compose file is read as ``docker compose`` reads it: variables interpolated from the shell environment over
the project's ``.env`` (or ``--env-file``); a required variable left unset is an error naming it. The service's
container settings become ``[container]`` (:mod:`.container`), its ``vllm serve`` command typed ``[launch]`` keys
plus ``extra_args`` and the rendezvous flags ``[node]`` and ``[cluster]`` (:mod:`.command`). What cannot be
carried is listed, in the output's header and to the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkd.cli.compose.command import launch_keys, words_of
from sparkd.cli.compose.container import container_section
from sparkd.cli.compose.interpolate import ComposeError, interpolate, key_path, read_env_file
from sparkd.cli.compose.secrets import move_secrets
from sparkd.config import ConfigError, config_from_mapping

__all__ = ["ComposeError", "Imported", "import_compose"]


@dataclass(frozen=True)
class Imported:
    toml: str
    not_carried: list[str] = field(default_factory=list)


def _load(path: Path) -> dict[str, Any]:
    try:
        import yaml  # only this command reads YAML
    except ImportError:
        raise ComposeError("reading compose files needs PyYAML: pip install 'sparkd[compose]' (or pyyaml) into "
                           "sparkd's environment") from None

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ComposeError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise ComposeError(f"{path}: no services: a compose file lists them under 'services:'")
    return doc


def _service(doc: Mapping[str, Any], name: str | None, path: Path) -> tuple[str, dict[str, Any]]:
    services = doc["services"]
    if name is None:
        if len(services) != 1:
            raise ComposeError(f"{path}: {len(services)} services ({', '.join(services)}); name one with --service")
        name = next(iter(services))
    if name not in services:
        raise ComposeError(f"{path}: no service {name!r} (services: {', '.join(services)})")
    service = services[name]
    if not isinstance(service, dict):
        raise ComposeError(f"{path}: {key_path('services', name)} is not a mapping")
    return name, service


def import_compose(path: Path, *, service: str | None = None, env_file: Path | None = None,
                   environ: Mapping[str, str] | None = None, runtime: str = "docker-run") -> Imported:
    """The config for one service of the compose file ``path``. Raises ComposeError naming what is wrong."""
    import os

    doc = _load(path)
    dotenv = env_file or path.parent / ".env"
    variables = {**(read_env_file(dotenv) if env_file or dotenv.exists() else {}),
                 **(os.environ if environ is None else environ)}
    name, raw = _service(doc, service, path)
    where = key_path("services", name)
    spec = interpolate(raw, variables, where)
    notes: list[str] = []
    container, supervisor = container_section(spec, name, path.parent, notes, variables)
    words, command_env = words_of(spec.get("command"), spec.get("entrypoint"), where, notes, container["image"])
    keys = launch_keys(words, where, notes)
    if command_env:
        keys["launch"]["env"] = command_env
    data: dict[str, Any] = {"runtime": runtime, "node": keys["node"], "container": container,
                            "launch": keys["launch"], "cluster": keys["cluster"], "supervisor": supervisor}
    move_secrets(data, where, notes)
    data = {k: v for k, v in data.items() if v not in ({}, None)}
    try:
        config_from_mapping(data, source=f"{path} ({where})", env={})
    except ConfigError as exc:
        raise ComposeError("; ".join(exc.problems)) from None
    header = [f"# sparkd config imported from {path} (service {name}) by `sparkd import-compose`.",
              "# Check it with `sparkd check-config --config FILE`; set [node] name and address per node."]
    header += [f"# not carried: {note}" for note in notes]
    return Imported("\n".join(map(_comment, header)) + "\n\n" + _toml(data), notes)


def _comment(text: str) -> str:
    """``text`` fit for one TOML comment line: a control character (which TOML refuses in a comment, and a newline
    would end it) is written as its escape, as the value itself is below."""
    return "".join(f"\\u{ord(c):04x}" if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F else c for c in text)


def _toml(data: dict[str, Any]) -> str:
    """The config as TOML (tomli-w), nothing left out: TOML has no null, and no key here is ``None``."""
    import tomli_w

    try:
        return tomli_w.dumps(data)
    except TypeError as exc:  # a value from the file that validated but has no TOML form
        raise ComposeError(f"a value cannot be written as TOML: {exc}") from None
