"""The sections of the sparkd config, one pydantic model each. :mod:`sparkd.config` assembles and loads them."""

from __future__ import annotations

import re
import socket
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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
    # Extra labels on every container sparkd creates (sparkd adds sparkd.managed, sparkd.node, ...).
    labels: dict[str, str] = Field(default_factory=dict)
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
    # Fabric addresses of the other nodes' sparkd daemons ("host" or "host:port"; the port defaults to
    # [api] port): the head lists its workers, a worker its head. With peers, the pair is one unit.
    peers: list[str] = Field(default_factory=list)
    nnodes: int | None = Field(default=None, ge=1)
    peer_timeout_s: float = Field(default=5.0, gt=0)
    peer_poll_s: float = Field(default=2.0, gt=0)
    # A peer unreachable this long is lost: the worker stops its rank, the head stops and waits for it.
    peer_grace_s: float = Field(default=30.0, ge=0)
    # How long the head waits for every worker rank to be up and waiting for the master.
    worker_start_timeout_s: float = Field(default=600.0, gt=0)


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
    # Past startup_timeout_s a start goes on while its log showed progress within this many seconds.
    startup_extension_s: float = Field(default=300.0, ge=0)
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
    canary_interval_s: float = Field(
        default=15.0, gt=0,
        description="Seconds between test generations. A wedge that begins on an idle engine shows only to a canary "
                    "(vLLM's gauges move only when an engine step completes), so this bounds how late it is seen.")
    canary_timeout_s: float = Field(
        default=30.0, gt=0,
        description="A test generation with no answer after this long is busy; on an idle engine that completed no "
                    "step meanwhile it is a hang.")
    busy_grace_s: float = Field(
        default=600.0, ge=0,
        description="Only when no engine step is observable (vLLM runs with --disable-log-stats): how long canary "
                    "timeouts while /health is 200 count as busy before they are a hang.")
    stall_after_s: float = Field(
        default=45.0, gt=0,
        description="Requests running, a canary unanswered and no engine step completed for this long is a stall "
                    "(raised to twice the longest step seen while busy, e.g. during a 1M-token prefill).")
    execute_timeout_s: float | None = Field(
        default=None, gt=0,
        description="How long vLLM lets one engine step run before it kills the engine "
                    "(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS). After a JIT-compile line the stall check waits this long "
                    "before it calls a wedge, so a compile vLLM would survive is not restarted. Unset: the launch "
                    "environment's value (sparkd's default env sets 1800), else vLLM's own default, 300.")


# Preflight check ids (sparkd/preflight), in the order they run; `[preflight] skip` takes these.
PreflightCheckId = Literal[
    "launch_target", "stale_processes", "ports", "dev_shm", "page_cache", "memory", "host", "image", "gpu",
]


class ImageAssert(_Section):
    """One integrity assertion on a file where vLLM runs (inside the container for docker runtimes): the
    number of lines of ``path`` matching the regular expression ``pattern`` must be ``count`` (``grep -c``).
    The field's double-applied mxfp4.py patch: ``pattern = "empty_cache"``, ``count = 2`` (3 when re-applied)."""

    path: str
    pattern: str
    count: int = Field(ge=0)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path")
        return value

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


class PreflightConfig(_Section):
    """What preflight checks and fixes before every launch (``sparkd preflight`` runs it alone)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)  # `assert` or `asserts`

    # Check ids not to run (reported as skipped).
    skip: list[PreflightCheckId] = Field(default_factory=list)
    # Stale VLLM::* processes: SIGTERM, this grace, then SIGKILL.
    kill_grace_s: float = Field(default=5.0, ge=0)
    # /dev/shm must have at least this much free space after the sweep (vLLM's rings need ~200 MiB).
    shm_min_free_mib: int = Field(default=256, ge=0)
    # `sync` and write 3 to /proc/sys/vm/drop_caches before the memory check.
    drop_caches: bool = True
    # MemFree must cover gpu_memory_utilization x MemTotal plus this margin.
    memory_margin_gib: float = Field(default=2.0, ge=0)
    # Host hardening, reported as warnings: swap off, vm.min_free_kbytes floor (0: not checked; the field uses
    # 1.5-3 GiB), vm.overcommit_memory (the field sets 0).
    swap_off: bool = True
    min_free_kbytes: int = Field(default=1572864, ge=0)
    overcommit_memory: int | None = Field(default=0, ge=0, le=2)
    # Apply the hardening (swapoff -a, write the sysctls) instead of only reporting it.
    apply_host: bool = False
    # [[preflight.assert]] tables: file contents checked where vLLM runs.
    asserts: list[ImageAssert] = Field(default_factory=list, alias="assert")


class GuardConfig(_Section):
    """The unified-memory guard (sparkd/guard). Sizes are bytes; strings such as ``"4 GiB"`` or ``"512MiB"``
    are accepted. Floors are absolute, never percentages: on GB10 the driver's memory hides from every
    percentage base. Rules and their order: ``sparkd/guard/policy.py``."""

    enabled: bool = True
    # Decide and log as usual, but never stop, kill or restart anything.
    dry_run: bool = False
    # Floors on MemAvailable: warn < refuse a start < stop (SIGTERM + grace) < SIGKILL of the vLLM tree.
    warn_below: int = 8 * 1024**3
    refuse_start_below: int = 16 * 1024**3
    stop_below: int = 4 * 1024**3
    kill_below: int = 2 * 1024**3
    # A level holds until MemAvailable (or MemFree) is back above its floor plus this.
    recover_margin: int = 1024**3
    # Consecutive samples past a floor before the guard acts on it.
    debounce_samples: int = Field(default=3, ge=1)
    # MemFree under free_below counts as a stop, but only while MemAvailable is under free_gate_below: MemFree
    # sits near zero whenever page cache is full (an ungated MemFree trigger killed a healthy launch).
    free_below: int = 2 * 1024**3
    free_gate_below: int = 8 * 1024**3
    # PSI `full avg10` (percent) at or above this lifts a warn/stop level one stage; None turns it off.
    psi_full_avg10_escalate: float | None = Field(default=40.0, gt=0, le=100)
    # NV_ERR_NO_MEMORY in the kernel log within this many seconds lifts a warn/stop level one stage (0: off).
    nvrm_escalate_s: float = Field(default=10.0, ge=0)
    stop_grace_s: float = Field(default=30.0, ge=0)
    # After a kill (after a stop: its grace plus this) no repeat and no start: memory takes time to come back.
    cooldown_s: float = Field(default=15.0, ge=0)
    # Sampling: the interval is the distance to the next floor over fill_rate, clamped; fast while starting.
    min_interval_s: float = Field(default=0.005, gt=0)
    max_interval_s: float = Field(default=1.0, gt=0)
    starting_interval_s: float = Field(default=0.025, gt=0)
    fill_rate: int = Field(default=16 * 1024**3, gt=0)  # bytes per second the pool can plausibly drain at
    # Kernel PSI trigger (`<some|full> <stall us> <window us>`) that wakes the sampler; None: polling only.
    psi_trigger: str | None = "some 150000 1000000"
    kernel_log: bool = True
    # Leak trend: Theil-Sen slope of MemAvailable over trend_window_s, one point per trend_step_s.
    trend_window_s: float = Field(default=600.0, gt=0)
    trend_step_s: float = Field(default=10.0, gt=0)
    trend_min_span_s: float = Field(default=120.0, gt=0)
    # Warn when the stop floor is predicted closer than this (seconds).
    trend_warn_s: float = Field(default=3600.0, ge=0)
    # Ask for a planned restart at the next idle moment when the floor is closer than this; None: never.
    trend_restart_s: float | None = Field(default=None, gt=0)
    # Sources, pointable elsewhere for tests.
    meminfo_path: Path = Path("/proc/meminfo")
    pressure_path: Path = Path("/proc/pressure/memory")
    kmsg_path: Path = Path("/dev/kmsg")

    @field_validator(
        "warn_below", "refuse_start_below", "stop_below", "kill_below", "recover_margin", "free_below",
        "free_gate_below", "fill_rate", mode="before",
    )
    @classmethod
    def _size(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", value.lower())
        if m is None:
            raise ValueError(f"{value!r} is not a size like '4 GiB', '512 MiB' or a number of bytes")
        return int(float(m.group(1)) * 1024 ** "bkmgt".index(m.group(2) or "b"))

    @field_validator(
        "warn_below", "refuse_start_below", "stop_below", "kill_below", "recover_margin", "free_below",
        "free_gate_below",
    )
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    @field_validator("psi_trigger")
    @classmethod
    def _trigger(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(some|full) \d+ \d+", value):
            raise ValueError(f"{value!r} is not a PSI trigger like 'some 150000 1000000'")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> GuardConfig:
        if not self.kill_below < self.stop_below < self.warn_below:
            raise ValueError("need kill_below < stop_below < warn_below")
        if self.refuse_start_below < self.stop_below:
            raise ValueError("refuse_start_below must be >= stop_below (a start under it would be stopped)")
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s must be <= max_interval_s")
        return self
