"""Launch profiles from the field reports: partial ``[launch]`` tables applied under a config's own values.

The TOML files live beside this module (``config/profiles`` in the repository points here) so that an
installed sparkd finds them without the source tree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

PROFILE_DIR = Path(__file__).parent


class ProfileError(ValueError):
    """The profile a config names cannot be used; the message is about ``launch.profile``."""


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name: str) -> dict[str, Any]:
    """The ``[launch]`` values of profile ``name``; LookupError names the known profiles."""
    launch: dict[str, Any] = profile_tables(name).get("launch", {})
    return launch


# The tables a profile may set under a config's own: its launch, and what the acceptance gate expects of it.
LAYERED = ("launch", "acceptance")


def profile_tables(name: str) -> dict[str, dict[str, Any]]:
    """The tables of profile ``name`` that layer under a config (``[launch]``, ``[acceptance]``); LookupError names
    the known profiles."""
    path = PROFILE_DIR / f"{name}.toml"
    if "/" in name or not path.is_file():
        raise LookupError(f"unknown profile {name!r} (known: {', '.join(profile_names())})")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {table: data[table] for table in LAYERED if isinstance(data.get(table), dict)}


def profile_needs_cuda_graphs(name: str | None) -> bool:
    if name is None:
        return False
    path = PROFILE_DIR / f"{name}.toml"
    if not path.is_file():
        return False
    meta = tomllib.loads(path.read_text(encoding="utf-8")).get("profile", {})
    return bool(meta.get("cuda_graphs", False))
