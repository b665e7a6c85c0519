"""What changed between two configs, as an operator reads it. Pure.

``launch_changes`` compares the rendered launches (argv and environment — what vLLM would actually get);
``setting_changes`` compares every other key. ``NEEDS_RESTART`` are the keys a running daemon cannot take on
(who it is, where it keeps state, how it is reached, what it opens when it starts): a reload reports them and they
apply when sparkd restarts. A secret (``sparkd.config.secretrule``: ``launch.api_key``, secret-named environment
values) is never shown: a change of one reads ``(secret …) → (secret …)``, digests under a key of this process's
own.
"""

from __future__ import annotations

from typing import Any

from sparkd.config import Config
from sparkd.config.secretrule import digest, is_secret_name
from sparkd.launch.render import render

NEEDS_RESTART = (
    # who it is and where it keeps state
    "node.name", "node.role", "node.rank", "runtime", "paths.",
    # how it is reached, and the group it belongs to
    "api.port", "api.listen", "api.socket_group", "api.token_file", "api.tls_cert", "api.tls_key", "api.tls_ca",
    "cluster.peers", "cluster.nnodes",
    # what it opens when it starts: the guard and its sources, the flight recorder's ring and watchdog, the journal
    "guard.enabled", "guard.meminfo_path", "guard.pressure_path", "guard.psi_trigger", "guard.kernel_log",
    "guard.kmsg_path", "recorder.enabled", "recorder.path", "recorder.ring_size", "recorder.sync_interval_s",
    "recorder.hardware_watchdog", "recorder.watchdog_device", "recorder.watchdog_timeout_s", "recorder.boot_id_path",
    "log.vllm_to_journal",
)


def _shown(value: str | None, secret: bool) -> str:
    if value is None:
        return "(unset)"
    return digest(value) if secret else repr(value)


def launch_changes(old: Config, new: Config) -> list[str]:
    before, after = render(old), render(new)
    lines: list[str] = []
    if before.argv != after.argv:
        old_units, new_units = _units(before.argv), _units(after.argv)
        removed = [u for u in old_units if u not in new_units]
        added = [u for u in new_units if u not in old_units]
        lines.append(f"argv: removed {', '.join(removed) or 'nothing'}; added {', '.join(added) or 'nothing'}")
    for name in sorted(before.env.keys() | after.env.keys()):
        a, b = before.env.get(name), after.env.get(name)
        if a != b:
            lines.append(f"env {name}: {_shown(a, False)} → {_shown(b, False)}")
    for name in sorted(before.secret_env.keys() | after.secret_env.keys()):
        a, b = before.secret_env.get(name), after.secret_env.get(name)
        if a != b:
            lines.append(f"env {name}: {_shown(a, True)} → {_shown(b, True)}")
    return lines


def _units(argv: tuple[str, ...]) -> list[str]:
    """argv as an operator reads it: each flag with its value (``--max-model-len 8192``), other words alone."""
    units: list[str] = []
    for word in argv:
        if units and units[-1].startswith("--") and " " not in units[-1] and not word.startswith("--"):
            units[-1] += f" {word}"
        else:
            units.append(word)
    return units


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def setting_changes(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for every key outside [launch] that differs; a secret's values as digests."""
    a = _flat({k: v for k, v in old.model_dump(mode="json").items() if k != "launch"})
    b = _flat({k: v for k, v in new.model_dump(mode="json").items() if k != "launch"})
    names = {*old.launch.secret_env, *new.launch.secret_env}
    out = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) == b.get(key):
            continue
        if ".env." in key and is_secret_name(key.rsplit(".", 1)[-1], names):
            out.append((key, _masked(a.get(key)), _masked(b.get(key))))
        else:
            out.append((key, a.get(key), b.get(key)))
    return out


def _masked(value: Any) -> Any:
    return value if value is None else _Shown(digest(str(value)))


class _Shown(str):
    """A value already made safe to show: its repr is itself (no quotes around a digest)."""

    def __repr__(self) -> str:
        return str(self)


def needs_restart(key: str) -> bool:
    return any(key == fixed or (fixed.endswith(".") and key.startswith(fixed)) or key.startswith(fixed + ".")
               for fixed in NEEDS_RESTART)
