"""Typed configuration: one TOML file plus ``SPARKD_*`` environment overrides (:mod:`sparkd.config.env`) and a
launch profile, layered by pydantic-settings (:mod:`sparkd.config.layers`).

The config is the known-good launch. argv, environment and the launch script are rendered from it
(:mod:`sparkd.launch.render`); nothing about a launch depends on a file someone edited inside a container.

Every problem is one ``key: message`` line naming the key (or the ``SPARKD_*`` variable that set it); no
input, however broken (a directory, binary bytes, a table nested 20,000 deep, ``inf``), ends in a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparkd.config.acceptance import AcceptanceConfig, AcceptancePrompt
from sparkd.config.container import ContainerConfig, Mount
from sparkd.config.env import ENV_PREFIX, Override, OverrideError, variable_for
from sparkd.config.fabric import FabricConfig, WeightsConfig
from sparkd.config.layers import ProfileError, layered
from sparkd.config.notify import NotifyConfig
from sparkd.config.recorder import RecorderConfig
from sparkd.config.secretrule import MASK, is_secret_name, mask_shapes
from sparkd.config.sections import (
    ApiConfig,
    ClusterConfig,
    LaunchConfig,
    LintConfig,
    LogConfig,
    LogFormat,
    LogLevel,
    NodeConfig,
    PathsConfig,
    Role,
    RuntimeKind,
)
from sparkd.config.stop import StopConfig
from sparkd.config.supervision import (
    GuardConfig,
    HealthConfig,
    ImageAssert,
    PreflightCheckId,
    PreflightConfig,
    RestartConfig,
    SupervisorConfig,
)

__all__ = [
    "DEFAULT_CONFIG_PATH", "ENV_PREFIX", "AcceptanceConfig", "AcceptancePrompt", "ApiConfig", "ClusterConfig", "Config",
    "ConfigError", "ContainerConfig", "FabricConfig", "GuardConfig", "HealthConfig", "ImageAssert", "LaunchConfig",
    "LintConfig", "LogConfig", "LogFormat", "LogLevel", "Mount", "NodeConfig", "NotifyConfig", "PathsConfig",
    "PreflightCheckId", "PreflightConfig", "RecorderConfig", "RestartConfig", "Role", "RuntimeKind", "StopConfig",
    "SupervisorConfig", "WeightsConfig", "config_from_mapping", "load_config", "read_toml",
]

DEFAULT_CONFIG_PATH = Path("/etc/sparkd/sparkd.toml")
# Deeper than any real config; deeper input is refused before anything recurses into it.
MAX_DEPTH = 32


class ConfigError(Exception):
    """A config that cannot be used. ``problems`` are ``key: message`` lines, each naming its key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class Config(BaseModel):
    """The whole sparkd config. Build it with :func:`load_config`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: NodeConfig = Field(default_factory=NodeConfig, description="This node: its name, role and rank.")
    runtime: RuntimeKind = Field(default=RuntimeKind.docker_exec, description=(
        "How vLLM runs: `docker-exec` (exec'd into a long-lived container), `docker-run` (a container per "
        "launch) or `process` (on the host, as sparkd's child)."))
    container: ContainerConfig = Field(default_factory=ContainerConfig, description=(
        "vLLM's container (the docker runtimes)."))
    launch: LaunchConfig = Field(description="`vllm serve` and its flags: the known-good launch.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description=(
        "The pair: peers' daemons and the rendezvous."))
    paths: PathsConfig = Field(default_factory=PathsConfig, description="Where sparkd keeps state, socket and logs.")
    lint: LintConfig = Field(default_factory=LintConfig, description="`sparkd check-config`'s lint rules.")
    api: ApiConfig = Field(default_factory=ApiConfig, description=(
        "The control socket and the TCP port (metrics, peer API)."))
    log: LogConfig = Field(default_factory=LogConfig, description="sparkd's own log, and vLLM's output.")
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig, description=(
        "Start, stop, log and incident budgets."))
    stop: StopConfig = Field(default_factory=StopConfig, description=(
        "How a stop sparkd chooses treats the requests in flight: the drain."))
    restart: RestartConfig = Field(default_factory=RestartConfig, description="Backoff, budget and breaker.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Health probes.")
    preflight: PreflightConfig = Field(default_factory=PreflightConfig, description=(
        "Checks and clean-up before every launch."))
    guard: GuardConfig = Field(default_factory=GuardConfig, description="The unified-memory guard.")
    recorder: RecorderConfig = Field(default_factory=RecorderConfig, description=(
        "The flight recorder, the memory settle before a start, the restart gate and the hardware watchdog."))
    fabric: FabricConfig = Field(default_factory=FabricConfig, description=(
        "The group's fabric, measured by the head before every start."))
    weights: WeightsConfig = Field(default_factory=WeightsConfig, description=(
        "The model directory's manifest, compared across the group's nodes before every start."))
    notify: NotifyConfig = Field(default_factory=NotifyConfig, description=(
        "Webhooks told at once of failures, the breaker, the memory guard's actions and recoveries."))
    acceptance: AcceptanceConfig = Field(default_factory=AcceptanceConfig, description=(
        "The acceptance gate between serving and ready: capacity, the answers' fingerprint, garble, speculative "
        "decoding, numerics."))

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
    def listen(self) -> str:
        """The TCP port's address: ``[api] listen``, else this node's fabric address, else loopback."""
        return self.api.listen or self.node.address or "127.0.0.1"

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
            "drain_s": self.stop.drain_s,  # rendered as --shutdown-timeout: vLLM reads it when it starts
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
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"TOML syntax error: {exc}"]) from None
    except RecursionError:
        raise ConfigError(str(path), [f"TOML nested too deeply (sparkd reads at most {MAX_DEPTH} levels)"]) from None
    if not data and not text.strip():
        raise ConfigError(str(path), ["the file is empty (a config needs at least [launch] model = ...)"])
    return data


def load_config(
    path: Path | str, *, env: Mapping[str, str] | None = None, profile: str | None = None,
) -> Config:
    """Load ``path``, apply ``SPARKD_*`` overrides and its ``launch.profile`` (or ``profile``), validate."""
    path = Path(path)
    data = read_toml(path)
    return config_from_mapping(data, source=str(path), env=env, profile=profile)


def config_from_mapping(
    data: dict[str, Any], *, source: str = "<config>", env: Mapping[str, str] | None = None,
    profile: str | None = None,
) -> Config:
    """Validate ``data`` (a config file's tables) with the ``SPARKD_*`` overrides in ``env`` (default: the
    process environment) and the launch profile applied. Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    too_deep = _too_deep(data)
    if too_deep is not None:
        raise ConfigError(source, [f"{too_deep}: nested deeper than {MAX_DEPTH} levels"])
    try:
        data, overrides = layered(data, env, Config, profile)
    except OverrideError as exc:
        raise ConfigError("from the environment", exc.problems) from None
    except ProfileError as exc:
        raise ConfigError(source, [str(exc)]) from None
    except RecursionError:
        raise ConfigError(source, [f"nested deeper than {MAX_DEPTH} levels"]) from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = _describe(exc, overrides)
        from_env = all(p.startswith(ENV_PREFIX) for p in problems)
        raise ConfigError("from the environment" if from_env else source, problems) from None
    except RecursionError:
        raise ConfigError(source, [f"nested deeper than {MAX_DEPTH} levels"]) from None


def _too_deep(data: Any) -> str | None:
    """The key path of the first value nested deeper than MAX_DEPTH, found without recursion."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return ".".join(path[:4]) + ". ..."
        if isinstance(value, dict):
            stack.extend((v, (*path, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, str(i))) for i, v in enumerate(value))
    return None


def _describe(exc: ValidationError, overrides: list[Override]) -> list[str]:
    """One line per error, naming the key (or the variable that set it); unknown keys first, since a typo'd
    section also makes its required keys missing."""
    problems: list[tuple[int, str]] = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        key = ".".join(loc) or "<root>"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key" + _suggest(loc)
        elif err["type"] == "missing":
            message = "required"
        elif not loc:
            problems.append((1, message))  # model-level checks name their own key
            continue
        if "input" in err and err["type"] not in ("missing", "extra_forbidden") and not _secret_key(loc):
            shown = _short_repr(err["input"])
            if shown not in message:
                message += f" (got {shown})"
        variable = variable_for(loc, overrides)
        where = f"{variable} ({key})" if variable else key
        problems.append((0 if err["type"] == "extra_forbidden" else 1, f"{where}: {message}"))
    return [line for _, line in sorted(problems, key=lambda p: p[0])]


def _secret_key(loc: list[str]) -> bool:
    """The key holds a secret (an invalid value is then not echoed: a reload refusal and status show it)."""
    notify_url = loc[:1] == ["notify"] and loc[-1] == "url"  # a webhook URL carries its token
    return notify_url or any(part in ("api_key", "secret_env") or is_secret_name(part) for part in loc)


def _short_repr(value: Any) -> str:
    """The invalid value as the message shows it, with anything shaped like a secret masked."""
    try:
        text = mask_shapes(repr(_masked(value)))
    except RecursionError:
        text = f"<a deeply nested {type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _masked(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and (k == "api_key" or is_secret_name(k)) else _masked(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, depth + 1) for v in value]
    return value


def _suggest(loc: list[str]) -> str:
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return ""
        model = field.annotation
    names = list(getattr(model, "model_fields", {}))
    import difflib  # a typo's suggestion: loaded by a config that has one, not by every daemon

    close = difflib.get_close_matches(loc[-1], names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
