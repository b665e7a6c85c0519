"""The sections of the sparkd config, one pydantic model each: the node, its container, the launch, the pair,
paths, the API, lint and logs. :mod:`sparkd.config.supervision` holds the sections that steer supervision;
:mod:`sparkd.config` assembles and loads them.

Every key carries a ``description``: ``sparkd config-reference`` and ``docs/config.md`` are generated from
them, so a key without one is a key nobody can look up (a test checks that each has one).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import types
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _ip_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::)") from None
    return value


def _host(value: str) -> str:
    """An IP address or a host name (RFC 1123 labels; not all-numeric, so 999.1.1.1 is no name)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a host name")
    return value


def env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged when every name is a valid environment variable name; else ValueError naming it."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
    return env


class Role(StrEnum):
    head = "head"
    worker = "worker"
    single = "single"


class RuntimeKind(StrEnum):
    docker_exec = "docker-exec"
    docker_run = "docker-run"
    process = "process"

    @property
    def in_container(self) -> bool:
        """vLLM runs in a container of ``[container] image`` (which must then be set)."""
        return self is not RuntimeKind.process


class _Section(BaseModel):
    # allow_inf_nan=False: `backoff_initial_s = inf` or `interval_s = nan` would leave a timer that never fires.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _false_turns_off(cls, data: Any) -> Any:
        """TOML has no null: ``false`` unsets a key that is on by default and may be off (``gpus = false``,
        ``psi_trigger = false``)."""
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            key = field.alias if isinstance(field.alias, str) else name
            if data.get(key) is False and field.default is not None and field.default is not False \
                    and _allows_none(field.annotation):
                data = {**data, key: None}
        return data


def _allows_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


class NodeConfig(_Section):
    name: str = Field(default_factory=socket.gethostname, description=(
        "This node's name in status, metrics (the `node` label), incidents and container labels. Default: the "
        "host name."))
    role: Role = Field(default=Role.single, description=(
        "`single`: one node serves alone. `head`: rank 0 of a pair, runs the API and leads every start. "
        "`worker`: a rank > 0, runs `--headless` on the head's word."))
    rank: int = Field(default=0, ge=0, description=(
        "This node's rank in a multi-node launch: the head is 0, workers 1, 2, ..."))
    address: str | None = Field(default=None, description=(
        "This node's address on the fabric between the Sparks; rendered as `VLLM_HOST_IP` unless the launch "
        "environment sets it."))


JsonTable = dict[str, Any]


def _flag(text: str) -> str:
    return text + " Unset: vLLM's default."


class LaunchConfig(_Section):
    """``vllm serve`` and its flags. Unset (None) flags are left to vLLM's defaults."""

    executable: str = Field(default="vllm", description="The program to run: `vllm`, or a path.")
    subcommand: str | None = Field(default="serve", description="Its subcommand; false: none.")
    script: str | None = Field(default=None, description=(
        "A user's own launch script (the migration path). When set, sparkd runs `bash SCRIPT EXTRA_ARGS...` "
        "instead of rendering argv."))
    profile: str | None = Field(default=None, description=(
        "A launch profile (`latency`, `throughput`, `balanced`, `1m-context`) whose values apply under this "
        "section's own keys."))
    model: str = Field(description="The model: a path where vLLM runs, or a Hugging Face id. Required.")
    served_model_name: str | None = Field(default=None, description="`--served-model-name`; default: `model`.")
    host: str = Field(default="0.0.0.0", description=(
        "`--host`: the address vLLM's API listens on (an IP or a host name)."))
    port: int = Field(default=8000, ge=1, le=65535, description="`--port`: vLLM's API port; sparkd probes it.")
    trust_remote_code: bool = Field(default=False, description="`--trust-remote-code`.")
    tensor_parallel_size: int | None = Field(default=None, ge=1, description=_flag("`--tensor-parallel-size`."))
    pipeline_parallel_size: int | None = Field(default=None, ge=1, description=_flag("`--pipeline-parallel-size`."))
    kv_cache_dtype: str | None = Field(default=None, description=_flag("`--kv-cache-dtype`, e.g. `fp8`."))
    block_size: int | None = Field(default=None, ge=1, description=_flag("`--block-size`."))
    max_model_len: int | None = Field(default=None, ge=1, description=_flag("`--max-model-len`."))
    max_num_seqs: int | None = Field(default=None, ge=1, description=_flag("`--max-num-seqs`."))
    max_num_batched_tokens: int | None = Field(default=None, ge=1, description=_flag("`--max-num-batched-tokens`."))
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0, description=_flag(
        "`--gpu-memory-utilization` (0-1]; preflight checks free memory against it."))
    enable_prefix_caching: bool | None = Field(default=None, description=_flag(
        "`--enable-prefix-caching` (true) or `--no-enable-prefix-caching` (false)."))
    enable_chunked_prefill: bool | None = Field(default=None, description=_flag(
        "`--enable-chunked-prefill` (true) or `--no-enable-chunked-prefill` (false)."))
    enable_expert_parallel: bool = Field(default=False, description="`--enable-expert-parallel`.")
    disable_custom_all_reduce: bool = Field(default=False, description="`--disable-custom-all-reduce`.")
    enforce_eager: bool = Field(default=False, description="`--enforce-eager`.")
    load_format: str | None = Field(default=None, description=_flag("`--load-format`, e.g. `safetensors`."))
    compilation_config: JsonTable | None = Field(default=None, description=(
        "`--compilation-config` as a TOML table; rendered as JSON, quoted once."))
    speculative_config: JsonTable | None = Field(default=None, description=(
        "`--speculative-config` as a TOML table; rendered as JSON, quoted once."))
    default_chat_template_kwargs: JsonTable | None = Field(default=None, description=(
        "`--default-chat-template-kwargs` as a TOML table; rendered as JSON, quoted once."))
    override_generation_config: JsonTable | None = Field(default=None, description=(
        "`--override-generation-config` as a TOML table; rendered as JSON, quoted once."))
    tokenizer: str | None = Field(default=None, description=_flag("`--tokenizer`."))
    tokenizer_mode: str | None = Field(default=None, description=_flag("`--tokenizer-mode`."))
    tool_call_parser: str | None = Field(default=None, description=_flag("`--tool-call-parser`."))
    enable_auto_tool_choice: bool = Field(default=False, description="`--enable-auto-tool-choice`.")
    reasoning_parser: str | None = Field(default=None, description=_flag("`--reasoning-parser`."))
    api_key: str | None = Field(default=None, description=(
        "The key clients must send (vLLM reads it from `VLLM_API_KEY`; sparkd's probes send it). A secret: prefer "
        "`api_key_file` and keep the config free of it."))
    api_key_file: Path | None = Field(default=None, description=(
        "A file holding the API key (root's, mode 0600), instead of `api_key` in the config."))
    secret_env: list[str] = Field(default_factory=list, description=(
        "More environment variables whose values are secrets, besides those whose name has KEY, TOKEN, SECRET, "
        "PASSWORD or CREDENTIAL at the end of a word: passed to vLLM only through its environment, shown as "
        "`(secret)` everywhere else."))
    nnodes: int | None = Field(default=None, ge=1, description=(
        "`--nnodes`; default: `[cluster] nnodes`, else from the role."))
    node_rank: int | None = Field(default=None, ge=0, description="`--node-rank`; default: `[node] rank`.")
    master_addr: str | None = Field(default=None, description="`--master-addr`; default: `[cluster] master_addr`.")
    master_port: int | None = Field(default=None, ge=1, le=65535, description=(
        "`--master-port`; default: `[cluster] master_port`."))
    headless: bool | None = Field(default=None, description="`--headless`; default: true on a worker.")
    extra_args: list[str] = Field(default_factory=list, description=(
        "Flags sparkd has no key for, passed verbatim, one word per element."))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "vLLM's environment, merged over the recommended one (see `default_env`)."))
    default_env: bool = Field(default=True, description=(
        "Merge the field's recommended environment (UCX, OMP, NCCL, timeouts) under `env`."))

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

    @field_validator("host")
    @classmethod
    def _host_name(cls, value: str) -> str:
        return _host(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        env_names(dict.fromkeys(value, ""))
        return value

    @model_validator(mode="after")
    def _one_api_key(self) -> LaunchConfig:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("launch.api_key_file: set either api_key or api_key_file, not both")
        return self


class ClusterConfig(_Section):
    """The pair (or group): the other nodes' daemons and the rendezvous."""

    master_addr: str | None = Field(default=None, description=(
        "The head's fabric address: the torch.distributed rendezvous (TCPStore)."))
    master_port: int = Field(default=29501, ge=1, le=65535, description="The rendezvous port on the head.")
    peers: list[str] = Field(default_factory=list, description=(
        "The other nodes' sparkd (`host` or `host:port`; the port defaults to `[api] port`): the head lists its "
        "workers, a worker its head. With peers, the pair is one unit."))
    nnodes: int | None = Field(default=None, ge=1, description="Nodes in the launch; default: 1 alone, 2 in a pair.")
    gpus_per_node: int = Field(default=1, ge=1, description=(
        "GPUs each node gives the group (one on a DGX Spark): tensor × pipeline parallel = nnodes × this."))
    peer_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one request to a peer's sparkd.")
    peer_poll_s: float = Field(default=2.0, gt=0, description="How often each peer's sparkd is polled.")
    peer_grace_s: float = Field(default=30.0, ge=0, description=(
        "A peer unreachable this long is lost: the worker stops its rank, the head stops and waits for it. A start "
        "waits as long for every worker's sparkd to answer (two boxes booted together) before it calls one lost."))
    worker_start_timeout_s: float = Field(default=600.0, gt=0, description=(
        "How long the head waits for every worker rank to be up and waiting for the master."))
    image_match: Literal["id", "repo-digest", "label", "off"] = Field(default="id", description=(
        "How the ranks must agree on vLLM's image: `id` (the same local image id: copied with docker save/load "
        "or pulled), `repo-digest` (pulled from the same registry manifest), `label` (the same value of "
        "`image_label`: images built on each node from one revision), or `off`."))
    image_label: str = Field(default="org.opencontainers.image.revision", min_length=1, description=(
        "The image label compared across the ranks when `image_match = \"label\"`."))
    shared_env: list[str] = Field(
        default_factory=lambda: [
            "VLLM_*", "UCX_*", "NCCL_CUMEM_ENABLE", "NCCL_IB_DISABLE", "NCCL_NET", "TORCH_CUDA_ARCH_LIST",
            # Per node by design: addresses, paths, process titles, logging.
            "!VLLM_HOST_IP", "!VLLM_PORT", "!VLLM_CACHE_ROOT", "!VLLM_NCCL_SO_PATH", "!VLLM_PROCESS_NAME_PREFIX",
            "!VLLM_LOGGING_LEVEL", "!VLLM_CONFIGURE_LOGGING",
        ],
        description=("Environment variables every rank must set alike (fnmatch patterns over `[container] env` "
                     "and `[launch] env`; `!` excludes, for per-node values)."))


class PathsConfig(_Section):
    state_dir: Path = Field(default=Path("/var/lib/sparkd"), description=(
        "status.json, the instance record, incidents/ and (by default) logs/."))
    run_dir: Path = Field(default=Path("/run/sparkd"), description="The control socket `sparkd.sock`.")
    instances_dir: Path = Field(default=Path("/run/sparkd/instances"), description=(
        "Where every sparkd on this host registers its live launch, shared by all of them: a process of another "
        "live instance's launch is never stale (docs/design.md §7). A daemon that may not write it registers in "
        "`$XDG_RUNTIME_DIR/sparkd/instances`, which every instance reads too."))
    log_dir: Path | None = Field(default=None, description=(
        "vLLM's output (`vllm.log`, rotated); default `<state_dir>/logs`. The package's unit sets up "
        "/var/log/sparkd (`LogsDirectory=`)."))

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
    socket_group: str | None = Field(default="sparkd", description=(
        "Group that may use the control socket (`<run_dir>/sparkd.sock`, mode 0660), i.e. `sparkctl`."))
    listen: str | None = Field(default=None, description=(
        "IP address of the TCP port: Prometheus `/metrics` (open) and the peer API `/v1/*` (signed requests "
        "from `[cluster] peers` only). Default: `[node] address` (the fabric), else 127.0.0.1. A wildcard "
        "(0.0.0.0, ::) also opens the port on every other network the node is on."))
    port: int = Field(default=9479, ge=0, le=65535, description="The TCP port; 0: no TCP listener.")
    token_file: Path | None = Field(default=None, description=(
        "File holding the peers' shared secret (the same on every node; root's, mode 0600, at least 32 bytes: "
        "`openssl rand -hex 32`); requests between the peers are signed with it (HMAC). Without it `/v1/*` "
        "over TCP is closed."))
    tls_cert: Path | None = Field(default=None, description=(
        "This node's TLS certificate (PEM; its subjectAltName holds the address the peers use): with `tls_key` "
        "and `tls_ca`, the TCP port speaks TLS and the peers prove themselves with certificates (mutual TLS)."))
    tls_key: Path | None = Field(default=None, description="The private key of `tls_cert` (PEM, root's, mode 0600).")
    tls_ca: Path | None = Field(default=None, description=(
        "The CA (PEM) that signed every node's certificate: a peer's certificate must chain to it."))

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None else _ip_address(value)

    @model_validator(mode="after")
    def _tls_all_or_nothing(self) -> ApiConfig:
        given = {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_ca": self.tls_ca}
        if any(given.values()) and not all(given.values()):
            missing = ", ".join(f"api.{k}" for k, v in given.items() if v is None)
            raise ValueError(f"{missing}: required with the other TLS keys (mutual TLS needs all three)")
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


class LintConfig(_Section):
    allow: list[str] = Field(default_factory=list, description=(
        "Lint rule ids accepted deliberately, e.g. `[\"multiproc-fork\"]` (the field's traps: the last section "
        "below)."))


class LogFormat(StrEnum):
    auto = "auto"
    console = "console"
    json = "json"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogConfig(_Section):
    """sparkd's own log (stderr; the journal under systemd) and where vLLM's output goes."""

    format: LogFormat = Field(default=LogFormat.auto, description=(
        "`console`: readable lines; `json`: one JSON object per line; `auto`: console on a terminal, else JSON."))
    level: LogLevel = Field(default=LogLevel.info, description=(
        "Least severe level logged: debug, info, warning, error."))
    vllm_to_journal: bool = Field(default=False, description=(
        "Also send vLLM's output to the journal under `SYSLOG_IDENTIFIER=vllm` (`journalctl -t vllm`), "
        "when the journal runs. A burst the journal cannot take at once (a start's lines, where "
        "`net.unix.max_dgram_qlen` is 10) waits, up to 1 MiB, in order; lines are dropped (and "
        "`vllm_journal_failed` logged) only past that or while the journal is absent; at sparkd's exit what "
        "still waits is offered for a second more (`vllm_journal_left` logs what the journal would not take)."))
    probe_requests: bool = Field(default=False, description=(
        "Keep the access-log lines of sparkd's own probes (`/health`, `/metrics` and the canary, marked "
        "`?probe=sparkd`) in vllm.log, `sparkctl logs`, incidents and the journal. Off: they are left out, so they "
        "never bury vLLM's own lines; other clients' requests are always kept."))
