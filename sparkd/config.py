"""Typed configuration: one TOML file plus ``SPARKD_*`` environment overrides.

The config is the known-good launch. argv, environment and the launch script are rendered from it
(:mod:`sparkd.launch`); nothing about a launch depends on a file someone edited inside a container.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sparkd.config_sections import (
    ApiConfig,
    ClusterConfig,
    ContainerConfig,
    GuardConfig,
    HealthConfig,
    ImageAssert,
    LaunchConfig,
    LintConfig,
    Mount,
    NodeConfig,
    PathsConfig,
    PreflightCheckId,
    PreflightConfig,
    RestartConfig,
    Role,
    RuntimeKind,
    SupervisorConfig,
)
from sparkd.profiles import load_profile

__all__ = [
    "DEFAULT_CONFIG_PATH", "ENV_PREFIX", "ApiConfig", "ClusterConfig", "Config", "ConfigError", "ContainerConfig",
    "GuardConfig", "HealthConfig", "ImageAssert", "LaunchConfig", "LintConfig", "Mount", "NodeConfig",
    "PathsConfig", "PreflightCheckId", "PreflightConfig", "RestartConfig", "Role", "RuntimeKind",
    "SupervisorConfig", "config_from_mapping", "load_config", "read_toml",
]

DEFAULT_CONFIG_PATH = Path("/etc/sparkd/sparkd.toml")
ENV_PREFIX = "SPARKD_"


class ConfigError(Exception):
    """A config that cannot be used. ``problems`` are ``key: message`` lines, each naming its key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class Config(BaseSettings):
    """The whole sparkd config. Build it with :func:`load_config`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True,
    )

    node: NodeConfig = Field(default_factory=NodeConfig)
    runtime: RuntimeKind = RuntimeKind.docker_exec
    container: ContainerConfig = Field(default_factory=ContainerConfig)
    launch: LaunchConfig
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    lint: LintConfig = Field(default_factory=LintConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the file; the file arrives as init kwargs.
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _docker_needs_image(self) -> Config:
        if self.runtime.in_container and not self.container.image:
            raise ValueError(f"container.image: required when runtime is {self.runtime.value!r}")
        return self

    # Derived launch facts: [launch] overrides, else [node]/[cluster].
    @property
    def nnodes(self) -> int:
        return self.launch.nnodes or self.cluster.nnodes or (1 if self.node.role is Role.single else 2)

    @property
    def node_rank(self) -> int:
        return self.launch.node_rank if self.launch.node_rank is not None else self.node.rank

    @property
    def headless(self) -> bool:
        return self.launch.headless if self.launch.headless is not None else self.node.role is Role.worker

    @property
    def master_addr(self) -> str | None:
        return self.launch.master_addr or self.cluster.master_addr

    @property
    def master_port(self) -> int:
        return self.launch.master_port or self.cluster.master_port

    @property
    def served_name(self) -> str:
        return self.launch.served_model_name or self.launch.model

    def launch_hash(self) -> str:
        """A short hash of everything that shapes the launch; labels and drift checks use it."""
        payload = {
            "runtime": self.runtime.value,
            "container": self.container.model_dump(mode="json"),
            "launch": self.launch.model_dump(mode="json"),
            "rank": self.node_rank, "nnodes": self.nnodes, "headless": self.headless,
            "master": [self.master_addr, self.master_port],
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; syntax errors name the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), ["file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"cannot read: {exc}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"TOML syntax error: {exc}"]) from None


def load_config(
    path: Path | str, *, env: Mapping[str, str] | None = None, profile: str | None = None,
) -> Config:
    """Load ``path``, apply its ``launch.profile`` (or ``profile``) and ``SPARKD_*`` overrides, validate."""
    path = Path(path)
    data = read_toml(path)
    return config_from_mapping(data, source=str(path), env=env, profile=profile)


def config_from_mapping(
    data: dict[str, Any], *, source: str = "<config>", env: Mapping[str, str] | None = None,
    profile: str | None = None,
) -> Config:
    env = os.environ if env is None else env
    launch = data.get("launch")
    profile_name = profile or (launch.get("profile") if isinstance(launch, dict) else None)
    if profile_name is not None:
        if not isinstance(profile_name, str):
            raise ConfigError(source, ["launch.profile: must be a string"])
        try:
            defaults = load_profile(profile_name)
        except LookupError as exc:
            raise ConfigError(source, [f"launch.profile: {exc}"]) from None
        merged = {**defaults, **(launch or {}), "profile": profile_name}
        merged["env"] = {**defaults.get("env", {}), **(launch or {}).get("env", {})}
        data = {**data, "launch": merged}
    saved = None if env is os.environ else _swap_env(env)
    try:
        return Config(**data)
    except ValidationError as exc:
        raise ConfigError(source, _describe(exc)) from None
    finally:
        if saved is not None:
            _restore_env(saved)


def _swap_env(env: Mapping[str, str]) -> dict[str, str | None]:
    # pydantic-settings reads os.environ; present the SPARKD_* part of `env` instead, for this call only.
    saved: dict[str, str | None] = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        saved.setdefault(key, None)
        os.environ[key] = value
    return saved


def _restore_env(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _describe(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        key = ".".join(loc) or "<root>"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key" + _suggest(loc)
        elif err["type"] == "missing":
            message = "required"
        elif not loc:
            problems.append(message)  # model-level checks name their own key
            continue
        if "input" in err and err["type"] not in ("missing", "extra_forbidden"):
            message += f" (got {err['input']!r})"
        problems.append(f"{key}: {message}")
    return problems


def _suggest(loc: list[str]) -> str:
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return ""
        model = field.annotation
    names = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(loc[-1], names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

