"""The config's layers, stacked by pydantic-settings: what ``sparkd.config`` validates. Pure.

Highest priority first (``settings_customise_sources``):

1. the command line: ``--profile P`` (``sparkd check-config --profile``), which names the profile over the file;
2. the environment: ``SPARKD_<SECTION>__<KEY>`` (:class:`sparkd.config.env.SparkdEnvSource`);
3. the file: its tables as read (``sparkd.config.read_toml``);
4. the launch profile named by the layers above (``[launch] profile``): its values under ``[launch]``, its
   ``[launch.env]`` merged under the file's, its ``[acceptance]`` (the capacity band it expects) under the file's.

pydantic-settings merges them table by table (a higher layer's table merges into a lower one's key by key; any
other value replaces). The result is a plain mapping: ``sparkd.config.Config`` validates it, so that every error
is reported by one model, naming the key or the variable that set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sparkd.config.env import Override, SparkdEnvSource
from sparkd.config.profiles import profile_tables

__all__ = ["ProfileError", "layered"]


class ProfileError(ValueError):
    """The profile named cannot be used; the message is about ``launch.profile``."""


class _Mapping(PydanticBaseSettingsSource):
    """A layer that is a mapping already (the file's tables, the command line's keys)."""

    def __init__(self, settings_cls: type[BaseSettings], data: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = dict(data)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


class _Profile(PydanticBaseSettingsSource):
    """The launch profile that the layers above it name, as ``{"launch": {...}, "acceptance": {...}}``."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        launch = self.current_state.get("launch")
        name = launch.get("profile") if isinstance(launch, dict) else None
        if name is None:
            return {}
        if not isinstance(name, str):
            raise ProfileError("launch.profile: must be a string")
        try:
            return profile_tables(name)
        except LookupError as exc:
            raise ProfileError(f"launch.profile: {exc}") from None


class _Layers(BaseSettings):
    """No fields of its own: the merged layers stay as extras, for ``Config`` to validate."""

    model_config = SettingsConfigDict(extra="allow")


def layered(data: Mapping[str, Any], env: Mapping[str, str], root: type[BaseModel],
            profile: str | None = None) -> tuple[dict[str, Any], list[Override]]:
    """(the merged tables, the environment's overrides). Raises ``OverrideError`` (a bad variable) or
    :class:`ProfileError`."""
    env_source: list[SparkdEnvSource] = []

    class Layers(_Layers):
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any,
                                       dotenv_settings: Any, file_secret_settings: Any,
                                       ) -> tuple[PydanticBaseSettingsSource, ...]:
            env_source.append(SparkdEnvSource(settings_cls, env, root))
            command_line = _Mapping(settings_cls, {"launch": {"profile": profile}} if profile else {})
            return command_line, env_source[0], _Mapping(settings_cls, data), _Profile(settings_cls)

    merged = Layers().model_extra or {}
    return merged, env_source[0].overrides if env_source else []
