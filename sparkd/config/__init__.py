"""What an operator writes: the config file, its ``SPARKD_*`` overrides and the launch profiles, validated.

The package's face is :class:`Config`, :func:`load_config`, :class:`ConfigError` and the sections callers name
(``from sparkd.config import Config``). The model is :mod:`sparkd.config.model`; its sections are
:mod:`.sections`, :mod:`.container`, :mod:`.supervision`, :mod:`.fabric`, :mod:`.recorder` and
:mod:`.acceptance`; the environment layer :mod:`.env` and :mod:`.layers`; the profiles :mod:`.profiles`; the
generated reference :mod:`.reference`; what is a secret :mod:`.secretrule` and how a secret file is read
:mod:`.secretfile`.

The face loads the model on first use, not on import: ``sparkd check-config --profile <TAB>`` lists the profiles
(:mod:`sparkd.config.profiles`) within the CLI's 150 ms, without the ~0.3 s of pydantic (tests/bench/bench_cli.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "DEFAULT_CONFIG_PATH", "ENV_PREFIX", "AcceptanceConfig", "AcceptancePrompt", "ApiConfig", "ClusterConfig", "Config",
    "ConfigError", "ContainerConfig", "FabricConfig", "GuardConfig", "HealthConfig", "ImageAssert", "LaunchConfig",
    "LintConfig", "LogConfig", "LogFormat", "LogLevel", "Mount", "NodeConfig", "NotifyConfig", "PathsConfig",
    "PreflightCheckId", "PreflightConfig", "RecorderConfig", "RestartConfig", "Role", "RuntimeKind", "StopConfig",
    "SupervisorConfig", "WeightsConfig", "config_from_mapping", "load_config", "read_toml",
]

if TYPE_CHECKING:
    from sparkd.config.model import (
        DEFAULT_CONFIG_PATH,
        ENV_PREFIX,
        AcceptanceConfig,
        AcceptancePrompt,
        ApiConfig,
        ClusterConfig,
        Config,
        ConfigError,
        ContainerConfig,
        FabricConfig,
        GuardConfig,
        HealthConfig,
        ImageAssert,
        LaunchConfig,
        LintConfig,
        LogConfig,
        LogFormat,
        LogLevel,
        Mount,
        NodeConfig,
        NotifyConfig,
        PathsConfig,
        PreflightCheckId,
        PreflightConfig,
        RecorderConfig,
        RestartConfig,
        Role,
        RuntimeKind,
        StopConfig,
        SupervisorConfig,
        WeightsConfig,
        config_from_mapping,
        load_config,
        read_toml,
    )
else:
    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module("sparkd.config.model"), name)
        globals()[name] = value
        return value
