"""Typed configuration: one TOML file plus ``SPARKD_*`` environment overrides.

The config is the known-good launch. argv, environment and the launch script are rendered from it
(:mod:`sparkd.launch`); nothing about a launch depends on a file someone edited inside a container.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sparkd.profiles import load_profile

DEFAULT_CONFIG_PATH = Path("/etc/sparkd/sparkd.toml")
ENV_PREFIX = "SPARKD_"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A config that cannot be used. ``problems`` are ``key: message`` lines, each naming its key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class Role(StrEnum):
    head = "head"
    worker = "worker"
    single = "single"


class RuntimeKind(StrEnum):
    docker_exec = "docker-exec"
    docker_run = "docker-run"
    process = "process"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeConfig(_Section):
    name: str = Field(default_factory=socket.gethostname)
    role: Role = Role.single
    rank: int = Field(default=0, ge=0)
    # This node's address on the fabric between the Sparks; rendered as VLLM_HOST_IP unless the env sets it.
    address: str | None = None


class Mount(_Section):
    source: str
    target: str
    read_only: bool = False


class ContainerConfig(_Section):
    name: str = "vllm"
    image: str = ""
    mounts: list[Mount] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    shm_size: str | None = None
    host_network: bool = True
    host_ipc: bool = True
    gpus: str | None = "all"
    cap_add: list[str] = Field(default_factory=list)
    # The container's main process for docker-exec; vLLM runs beside it through `docker exec`.
    command: list[str] = Field(default_factory=lambda: ["sleep", "infinity"])
    # Where sparkd writes the rendered launch script inside the container.
    script_path: str = "/tmp/sparkd-launch.sh"

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+[bkmg]?", value.lower()):
            raise ValueError(f"{value!r} is not a size like '16g' or '512m'")
        return value


JsonTable = dict[str, Any]


class LaunchConfig(_Section):
    """``vllm serve`` and its flags. Unset (None) flags are left to vLLM's defaults."""

    executable: str = "vllm"
    subcommand: str | None = "serve"
    # A user's own launch script (migration path). When set, sparkd runs it instead of rendering argv.
    script: str | None = None
    profile: str | None = None
    model: str
    served_model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    trust_remote_code: bool = False
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str | None = None
    block_size: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    enable_expert_parallel: bool = False
    disable_custom_all_reduce: bool = False
    enforce_eager: bool = False
    load_format: str | None = None
    compilation_config: JsonTable | None = None
    speculative_config: JsonTable | None = None
    default_chat_template_kwargs: JsonTable | None = None
    override_generation_config: JsonTable | None = None
    tokenizer: str | None = None
    tokenizer_mode: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    api_key: str | None = None
    # Multi-node. Unset values come from [node] and [cluster]; set them only to override.
    nnodes: int | None = Field(default=None, ge=1)
    node_rank: int | None = Field(default=None, ge=0)
    master_addr: str | None = None
    master_port: int | None = Field(default=None, ge=1, le=65535)
    headless: bool | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # Merge the field's recommended environment (UCX, OMP, NCCL, timeouts) under `env`.
    default_env: bool = True

    @field_validator(
        "compilation_config", "speculative_config", "default_chat_template_kwargs",
        "override_generation_config", mode="before",
    )
    @classmethod
    def _json_tables(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                "write this JSON flag as a TOML table (e.g. compilation_config = { cudagraph_mode = "
                "\"PIECEWISE\" }), not a string: strings lose their quotes through shells"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value


class ClusterConfig(_Section):
    master_addr: str | None = None
    master_port: int = Field(default=29501, ge=1, le=65535)
    # Fabric addresses of the other nodes' sparkd daemons (the head lists its workers; a worker its head).
    peers: list[str] = Field(default_factory=list)
    nnodes: int | None = Field(default=None, ge=1)


class PathsConfig(_Section):
    state_dir: Path = Path("/var/lib/sparkd")
    run_dir: Path = Path("/run/sparkd")
    log_dir: Path | None = None  # default: <state_dir>/logs

    @property
    def logs(self) -> Path:
        return self.log_dir or self.state_dir / "logs"

    @property
    def incidents(self) -> Path:
        return self.state_dir / "incidents"

    @property
    def socket(self) -> Path:
        return self.run_dir / "sparkd.sock"


class ApiConfig(_Section):
    # Group that may use the control socket (<paths.run_dir>/sparkd.sock, mode 0660).
    socket_group: str | None = "sparkd"
    # One TCP port for Prometheus (/metrics, open) and the peer API (/v1/*, bearer token). port = 0: off.
    listen: str = "127.0.0.1"
    port: int = Field(default=9479, ge=0, le=65535)
    token_file: Path | None = None


class LintConfig(_Section):
    # Lint rule ids to accept deliberately, e.g. ["multiproc-fork"].
    allow: list[str] = Field(default_factory=list)


class SupervisorConfig(_Section):
    startup_timeout_s: float = Field(default=3600.0, gt=0)
    # A silent start fails after this long without a progress line, even inside the startup budget.
    startup_silence_s: float = Field(default=900.0, gt=0)
    stop_grace_s: float = Field(default=90.0, ge=0)
    # On SIGTERM, leave vLLM running so a daemon upgrade or restart does not cost a cold start.
    leave_running: bool = False
    log_max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    log_backups: int = Field(default=3, ge=0)
    incidents_keep: int = Field(default=50, ge=1)


class RestartConfig(_Section):
    backoff_initial_s: float = Field(default=10.0, ge=0)
    backoff_factor: float = Field(default=2.0, ge=1.0)
    backoff_max_s: float = Field(default=300.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, le=1)
    stable_after_s: float = Field(default=600.0, ge=0)
    budget_failures: int = Field(default=5, ge=1)
    budget_window_s: float = Field(default=1800.0, gt=0)
    # This many failures in a row without a stable run also open the breaker (0: no such limit).
    consecutive_limit: int = Field(default=6, ge=0)
    # A memory-guard kill counts this many failures toward the budget.
    guard_kill_weight: int = Field(default=2, ge=1)


class HealthConfig(_Section):
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=5.0, gt=0)
    failure_threshold: int = Field(default=3, ge=1)
    success_threshold: int = Field(default=1, ge=1)
    canary: bool = True
    canary_interval_s: float = Field(default=60.0, gt=0)
    canary_timeout_s: float = Field(default=30.0, gt=0)
    busy_grace_s: float = Field(default=600.0, ge=0)
    stall_after_s: float = Field(default=120.0, gt=0)


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
        if self.runtime is not RuntimeKind.process and not self.container.image:
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

