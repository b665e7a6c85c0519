"""The config's layers: what ``sparkd.config`` validates. Pure.

Highest priority first:

1. the command line: ``--profile P`` (``sparkd check-config --profile``), which names the profile over the file;
2. the environment: ``SPARKD_<SECTION>__<KEY>`` (:mod:`sparkd.config.env`);
3. the file: its tables as read (``sparkd.config.read_toml``);
4. the launch profile named by the layers above (``[launch] profile``): its values under ``[launch]``, its
   ``[launch.env]`` merged under the file's, its ``[acceptance]`` (the capacity band it expects) under the file's.

pydantic-settings stacks them (:mod:`sparkd.config.sources`): a higher layer's table merges into a lower one's key by
key; any other value replaces. The result is a plain mapping: ``sparkd.config.Config`` validates it, so that every
error is reported by one model, naming the key or the variable that set it. A file with no profile named and no
override in the environment is the one layer there is: its tables are the result as they are, and pydantic-settings
is not loaded (a daemon that stacks nothing does without its ~1.3 MiB; tests/unit/test_config_layers.py holds the
two ways to the same mapping).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from sparkd.config.env import Override, parse_overrides
from sparkd.config.profiles import ProfileError

__all__ = ["ProfileError", "layered"]


def layered(data: Mapping[str, Any], env: Mapping[str, str], root: type[BaseModel],
            profile: str | None = None) -> tuple[dict[str, Any], list[Override]]:
    """(the merged tables, the environment's overrides). Raises ``OverrideError`` (a bad variable) or
    :class:`ProfileError`."""
    overrides = parse_overrides(env, root)
    launch = data.get("launch")
    if not overrides and profile is None and (not isinstance(launch, dict) or launch.get("profile") is None):
        return dict(data), overrides
    from sparkd.config.sources import stacked  # pydantic-settings: only where there are layers to stack

    return stacked(data, env, root, profile)
