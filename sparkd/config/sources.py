"""The config's layers as pydantic-settings sources, stacked by it (the owner's choice): what
:func:`sparkd.config.layers.layered` uses whenever there is more than the file to stack. Pure.

Highest priority first (``settings_customise_sources``): the command line's ``--profile``, the ``SPARKD_*``
environment (:class:`SparkdEnvSource`), the file's tables, and the launch profile that the layers above it name.
pydantic-settings merges them table by table (a higher layer's table merges into a lower one's key by key; any other
value replaces) and leaves the result as a plain mapping, for ``sparkd.config.Config`` to validate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from sparkd.config.env import ENV_PREFIX, SEPARATOR, Override, apply_overrides, parse_overrides
from sparkd.config.profiles import ProfileError, profile_tables

__all__ = ["SparkdEnvSource", "stacked"]


class SparkdEnvSource(EnvSettingsSource):
    """The ``SPARKD_*`` variables of ``env`` (default: the process environment) as a pydantic-settings source:
    calling it returns the nested tables they set for the model ``root`` (default: ``settings_cls``), and
    leaves the parsed :class:`Override` list, shortest path first, in ``overrides``. Raises
    :class:`~sparkd.config.env.OverrideError` listing every bad variable."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str] | None = None,
                 root: type[BaseModel] | None = None) -> None:
        self._given = env
        self.root: type[BaseModel] = root or settings_cls
        self.overrides: list[Override] = []
        super().__init__(settings_cls, case_sensitive=True, env_prefix=ENV_PREFIX, env_nested_delimiter=SEPARATOR,
                         env_ignore_empty=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        import os

        given = os.environ if self._given is None else self._given
        return {name: text for name, text in given.items() if name.startswith(self.env_prefix)}

    def __call__(self) -> dict[str, Any]:
        self.overrides = parse_overrides({k: v or "" for k, v in self.env_vars.items()}, self.root)
        return apply_overrides({}, self.overrides)


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


def stacked(data: Mapping[str, Any], env: Mapping[str, str], root: type[BaseModel],
            profile: str | None = None) -> tuple[dict[str, Any], list[Override]]:
    """(the merged tables, the environment's overrides). Raises ``OverrideError`` (a bad variable) or
    :class:`~sparkd.config.profiles.ProfileError`."""
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
