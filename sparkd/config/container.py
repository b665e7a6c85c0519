"""``[container]``: the container vLLM runs in (docker-exec, docker-run), complete for the field's deployments.

Everything ``docker run`` / compose says about the field's containers can be said here: privileged or the
``/dev/infiniband`` devices, ulimits (memlock -1 is the cure for NCCL's ``ibv_reg_mr`` ENOMEM), a memory ceiling,
oom_score_adj, the nvidia runtime, a user and security options. Sizes may be written ``64gb``, ``64g``, ``64 GiB``
or as bytes and are kept as bytes; ``~`` in a mount source is the home of the user sparkd runs as. Every value is
checked when the config loads, and an error names its key.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sparkd.config.sections import _Section, env_names

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SECURITY_OPT = re.compile(r"^(no-new-privileges(:(true|false))?|(seccomp|apparmor|label|systempaths)[=:].+)$")
UNLIMITED = -1
DOCKER_DEFAULT_SHM = 64 * 1024**2  # the engine's /dev/shm when none is configured

UlimitName = Literal[
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
    "rttime", "sigpending", "stack",
]
# Limits measured in bytes: a size spelling ("64m", "64 MiB") is accepted for these.
BYTE_LIMITS = frozenset({"core", "data", "fsize", "memlock", "msgqueue", "rss", "stack"})


def parse_size(value: Any) -> Any:
    """``64gb``, ``64g``, ``64 GiB``, ``512MiB``, ``1.5g`` -> bytes (binary multiples, as Docker reads them);
    numbers are returned as they are. Raises ValueError naming the spelling."""
    if not isinstance(value, str):
        return value
    m = _SIZE.fullmatch(value.lower())
    if m is None:
        raise ValueError(f"{value!r} is not a size like '64g', '64gb', '64 GiB', '512MiB' or a number of bytes")
    return int(float(m.group(1)) * 1024 ** "bkmgt".index(m.group(2) or "b"))


class Mount(_Section):
    """One mount: an absolute host path is bound, any other source is a named Docker volume."""

    source: str = Field(description="Host path (absolute, or ~/... for the home of the user sparkd runs as) "
                        "bound into the container, or the name of a Docker volume.")
    target: str = Field(description="Absolute path inside the container.")
    read_only: bool = Field(default=False, description="Mount read-only.")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if value.startswith("~"):
            expanded = os.path.expanduser(value)
            if expanded.startswith("~"):
                raise ValueError(f"{value!r}: no such user for '~'")
            return os.path.normpath(expanded)
        if value.startswith("/"):
            return os.path.normpath(value)
        if "/" in value or not _NAME.match(value):
            raise ValueError(f"{value!r} is neither an absolute host path (/... or ~/...) nor a volume name")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path inside the container")
        return os.path.normpath(value)


class Ulimit(_Section):
    """A resource limit for the container's processes; -1 is unlimited."""

    soft: int = Field(ge=UNLIMITED, description="Soft limit (-1: unlimited).")
    hard: int = Field(ge=UNLIMITED, description="Hard limit (-1: unlimited); not below the soft limit.")

    @model_validator(mode="after")
    def _ordered(self) -> Ulimit:
        if self.hard != UNLIMITED and (self.soft == UNLIMITED or self.soft > self.hard):
            raise ValueError(f"soft limit {self.soft} is above the hard limit {self.hard}")
        return self


def _limit_value(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().lower() in ("unlimited", "infinity", "-1"):
        return UNLIMITED
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a limit (a number, -1 or 'unlimited')")
    if isinstance(value, str) and name not in BYTE_LIMITS:
        if not value.strip().isdigit():
            raise ValueError(f"{value!r} is not a number")
        return int(value)
    return int(parse_size(value))


def ulimit(name: str, value: Any) -> dict[str, int]:
    """One ulimit as docker run, compose and TOML write it: ``-1``, ``"unlimited"``, ``67108864``, ``"64m"``,
    ``"1024:4096"`` or ``{soft = .., hard = ..}`` -> ``{"soft": .., "hard": ..}``."""
    if isinstance(value, dict):
        unknown = set(value) - {"soft", "hard"}
        if unknown or not value:
            raise ValueError(f"a table of soft and hard, not {sorted(unknown) or 'nothing'}")
        soft = _limit_value(name, value.get("soft", value.get("hard")))
        return {"soft": soft, "hard": _limit_value(name, value.get("hard", soft))}
    if isinstance(value, str) and ":" in value:
        soft_text, _, hard_text = value.partition(":")
        return {"soft": _limit_value(name, soft_text), "hard": _limit_value(name, hard_text)}
    limit = _limit_value(name, value)
    return {"soft": limit, "hard": limit}


def device(value: str) -> str:
    """``/dev/x``, ``/dev/x:/dev/y``, ``/dev/x:/dev/y:rw`` or ``/dev/x:rwm`` -> ``host:container:permissions``."""
    parts = value.split(":")
    if len(parts) == 2 and re.fullmatch(r"[rwm]+", parts[1]):
        parts = [parts[0], parts[0], parts[1]]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{value!r} is not HOST[:CONTAINER[:PERMISSIONS]]")
    host = parts[0]
    inside = parts[1] if len(parts) > 1 else host
    perms = parts[2] if len(parts) > 2 else "rwm"
    if not host.startswith("/") or not inside.startswith("/"):
        raise ValueError(f"{value!r}: device paths must be absolute")
    if not re.fullmatch(r"[rwm]+", perms) or len(set(perms)) != len(perms):
        raise ValueError(f"{value!r}: permissions must be letters of 'rwm'")
    return f"{os.path.normpath(host)}:{os.path.normpath(inside)}:{perms}"


class ContainerConfig(_Section):
    """The container vLLM runs in (runtimes docker-exec and docker-run)."""

    name: str = Field(default="vllm", description="Container name: docker-exec's long-lived container, or the "
                      "name each docker-run launch gets.")
    image: str = Field(default="", description="Image vLLM runs from (required for the docker runtimes).")
    mounts: list[Mount] = Field(default_factory=list, description="Bind mounts and named volumes.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the container (docker run -e); "
                                "[launch.env] is exported by the launch script on top of it.")
    shm_size: int | None = Field(default=None, gt=0, description="Size of the container's own /dev/shm "
                                 "(bytes, or a size such as \"64gb\", \"64g\", \"64 GiB\"); unused with host_ipc.")
    host_network: bool = Field(default=True, description="Share the host's network (--network host): NCCL over "
                               "RoCE and the API need it.")
    host_ipc: bool = Field(default=True, description="Share the host's IPC namespace and /dev/shm (--ipc host).")
    gpus: str | None = Field(default="all", description="GPUs to request (--gpus): 'all', a count, or "
                             "'device=0,1'; unset for none.")
    cap_add: list[str] = Field(default_factory=list, description="Linux capabilities to add (--cap-add), e.g. "
                               "IPC_LOCK.")
    privileged: bool = Field(default=False, description="Run privileged (--privileged): every host device, "
                             "including /dev/infiniband, and no limit on locked memory.")
    devices: list[str] = Field(default_factory=list, description="Host devices to add (--device "
                               "HOST[:CONTAINER[:PERMISSIONS]]), e.g. '/dev/infiniband' for RDMA without "
                               "privileged.")
    ulimits: dict[UlimitName, Ulimit] = Field(default_factory=dict, description="Resource limits (--ulimit): "
                                              "memlock = -1 (NCCL registers memory for RDMA), stack = 67108864, "
                                              "nofile; a value, 'unlimited', 'soft:hard' or {soft, hard}.")
    memory: int | None = Field(default=None, gt=0, description="Memory ceiling of the container (--memory; "
                               "bytes, or a size such as \"100g\"): its processes are killed before the host freezes.")
    memory_swap: int | None = Field(default=None, ge=UNLIMITED, description="Memory plus swap ceiling "
                                    "(--memory-swap; bytes, or a size such as \"120g\"); -1 unlimited.")
    oom_score_adj: int | None = Field(default=None, ge=-1000, le=1000, description="The container's "
                                      "oom_score_adj (--oom-score-adj): 500 makes vLLM the kernel's first choice.")
    runtime: str | None = Field(default=None, description="OCI runtime the engine starts the container with "
                                "(--runtime), e.g. 'nvidia'.")
    user: str | None = Field(default=None, description="User the container's processes run as (--user "
                             "NAME|UID[:GID]).")
    security_opt: list[str] = Field(default_factory=list, description="Security options (--security-opt), e.g. "
                                    "'seccomp=unconfined', 'apparmor=unconfined', 'no-new-privileges'.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every container sparkd "
                                   "creates (sparkd adds sparkd.managed, sparkd.node, ...).")
    command: list[str] = Field(default_factory=lambda: ["sleep", "infinity"], description="The container's main "
                               "process for docker-exec; vLLM runs beside it through docker exec.")
    script_path: str = Field(default="/tmp/sparkd-launch.sh", description="Where sparkd writes the rendered "
                             "launch script inside the container.")
    compile_cache_dir: str | None = Field(default="/var/cache/sparkd", description="docker-run: a host directory "
                                          "for vLLM's and FlashInfer's compile caches (`vllm/` and `flashinfer/` "
                                          "in it), bound where vLLM keeps them in each new container unless a "
                                          "writable mount of `mounts` holds that place already, so a restart finds "
                                          "its compile cache (the unit's CacheDirectory); false: none.")
    stop_timeout_s: int | None = Field(default=None, ge=0, description="docker-run: the container's own stop "
                                       "timeout (--stop-timeout), how long the engine waits after SIGTERM when "
                                       "something other than sparkd stops it (`docker stop` without -t, the "
                                       "engine's own shutdown). Unset: the drained stop's grace ([stop] drain_s "
                                       "plus [supervisor] stop_grace_s); check-config refuses a shorter one.")

    @field_validator("compile_cache_dir")
    @classmethod
    def _cache_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute host path")
        return None if value is None else os.path.normpath(value)

    @field_validator("shm_size", "memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)

    @field_validator("memory_swap", mode="before")
    @classmethod
    def _swap(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("-1", "unlimited"):
            return UNLIMITED
        return parse_size(value)

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str]) -> list[str]:
        return [device(v) for v in value]

    @field_validator("ulimits", mode="before")
    @classmethod
    def _ulimits(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {name: ulimit(name, limit) for name, limit in value.items()}

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.match(value):
            raise ValueError(f"{value!r} is not NAME, UID or NAME|UID:GROUP|GID")
        return value

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"{value!r} is not an OCI runtime name such as 'nvidia' or 'runc'")
        return value

    @field_validator("security_opt")
    @classmethod
    def _security_opt(cls, value: list[str]) -> list[str]:
        for option in value:
            if not _SECURITY_OPT.match(option):
                raise ValueError(f"{option!r} is not a security option like 'seccomp=unconfined', "
                                 "'apparmor=unconfined', 'label=disable' or 'no-new-privileges'")
        return value

    @field_validator("cap_add")
    @classmethod
    def _caps(cls, value: list[str]) -> list[str]:
        normal = [c.upper().removeprefix("CAP_") for c in value]
        for cap in normal:
            if not re.fullmatch(r"[A-Z_]+", cap):
                raise ValueError(f"{cap!r} is not a capability name like IPC_LOCK")
        return normal

    @model_validator(mode="after")
    def _swap_above_memory(self) -> ContainerConfig:
        if self.memory_swap not in (None, UNLIMITED) and (self.memory is None or self.memory_swap < self.memory):
            raise ValueError("memory_swap needs memory, and must not be below it")
        return self
