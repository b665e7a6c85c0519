"""Render the launch from the config: the exact argv, the environment, and the launch script.

JSON-valued flags are rendered as ``json.dumps`` of their TOML tables and every argument is quoted once
with :func:`shlex.quote`, so the program receives them byte for byte whatever shells sit in between.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkd import __version__
from sparkd.config import Config, HealthConfig, LaunchConfig
from sparkd.config.notify import notify_secrets
from sparkd.config.secretfile import SecretFileProblem, read_secret_file
from sparkd.config.secretrule import is_secret_name
from sparkd.launch.probe import ADMIT_ENV, DIR_ENV, EnvEdit, probe_dir, probe_edits

# The field's known-good environment (DESIGN.md §5). `[launch] env` overrides; `default_env = false` drops it.
RECOMMENDED_ENV: dict[str, str] = {
    "UCX_MEM_MMAP_HOOK_MODE": "none",
    "UCX_RCACHE_MAX_UNRELEASED": "1024",
    "OMP_NUM_THREADS": "8",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800",
    "NCCL_CUMEM_ENABLE": "0",
    # A cold start of DeepSeek-V4 on two Sparks takes 8-10 minutes; vLLM's own default is 600 s.
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
}

# Typed [launch] fields rendered as `--flag value`, in this order.
VALUE_FLAGS = (
    "served_model_name", "host", "port", "tensor_parallel_size", "pipeline_parallel_size",
    "kv_cache_dtype", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "gpu_memory_utilization", "load_format", "tokenizer", "tokenizer_mode", "tool_call_parser",
    "reasoning_parser",
)
# Typed fields rendered as a bare `--flag` when true.
SWITCH_FLAGS = (
    "trust_remote_code", "enable_expert_parallel", "disable_custom_all_reduce", "enforce_eager",
    "enable_auto_tool_choice",
)
# Flags vLLM defaults to on: rendered `--flag` when true and `--no-flag` when false, nothing when unset.
TRISTATE_FLAGS = ("enable_prefix_caching", "enable_chunked_prefill")
JSON_FLAGS = (
    "compilation_config", "speculative_config", "default_chat_template_kwargs", "override_generation_config",
)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# Secrets reach vLLM through its environment only: never argv (any user can read it), the script or its JSON.
# vLLM reads its API key from VLLM_API_KEY (vllm/envs.py; the API server takes args.api_key or that). Which
# variables are secrets is sparkd.config.secretrule's one rule.
API_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config_hash: str = ""
    # The drain vLLM is launched with (--shutdown-timeout): the grace of its drained stop is derived from it
    # (sparkd.supervisor.graces); in script mode the configured one, which lint holds the script's serve line to.
    drain_s: int = 0
    # The runtime adds these to the launch's environment; nothing renders or logs them.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    # Variables the script changes against what the environment already holds (the step probe's PYTHONPATH).
    env_edits: tuple[EnvEdit, ...] = ()
    # The step probe's directory: the runtime makes it (and mounts it into a container); None: the probe is off.
    probe_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        """argv and environment as shown to anyone: the secrets by name only."""
        shown: dict[str, Any] = {"argv": list(self.argv), "env": dict(self.env), "secret_env": sorted(self.secret_env)}
        if self.env_edits:
            shown["env_edits"] = [edit.to_json() for edit in self.env_edits]
        return shown

    def environment(self) -> dict[str, str]:
        """The launch's whole environment, secrets included: for the runtime's exec, nothing else."""
        return {**self.env, **self.secret_env}


def render_flags(cfg: Config) -> list[str]:
    """The ``vllm serve`` flags after the model, typed fields first, then ``extra_args``."""
    launch = cfg.launch
    args: list[str] = []
    for name in VALUE_FLAGS:
        value = getattr(launch, name)
        if value is not None:
            args += [flag(name), str(value)]
    for name in SWITCH_FLAGS:
        if getattr(launch, name):
            args.append(flag(name))
    for name in TRISTATE_FLAGS:
        value = getattr(launch, name)
        if value is not None:
            args.append(flag(name) if value else "--no-" + name.replace("_", "-"))
    for name in JSON_FLAGS:
        value = getattr(launch, name)
        if value is not None:
            args += [flag(name), json.dumps(value)]
    args += drain_flags(cfg)
    args += _multinode_flags(cfg)
    args += launch.extra_args
    return args


SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"


def drain_flags(cfg: Config) -> list[str]:
    """``--shutdown-timeout`` from ``[stop] drain_s``: vLLM drains that long on SIGTERM (vLLM 0.21+; its argparse
    reads an int). 0 is vLLM's own default and renders nothing, so a vLLM without the flag still launches."""
    return [SHUTDOWN_TIMEOUT_FLAG, str(cfg.stop.drain_s)] if cfg.stop.drain_s > 0 else []


def _multinode_flags(cfg: Config) -> list[str]:
    if cfg.nnodes <= 1:
        return []
    args = ["--nnodes", str(cfg.nnodes), "--node-rank", str(cfg.node_rank)]
    if cfg.master_addr:
        args += ["--master-addr", cfg.master_addr]
    args += ["--master-port", str(cfg.master_port)]
    if cfg.headless:
        args.append("--headless")
    return args


def render_env(cfg: Config) -> dict[str, str]:
    launch: LaunchConfig = cfg.launch
    env = dict(RECOMMENDED_ENV) if launch.default_env else {}
    if cfg.node.address:
        env["VLLM_HOST_IP"] = cfg.node.address
    env.update(launch.env)
    return env


@dataclass(frozen=True)
class EnvSetting:
    """One variable of vLLM's effective environment and the config key (or image) it comes from."""

    value: str
    key: str


def effective_env(cfg: Config, image_env: Mapping[str, str] | None = None, *,
                  host_env: Mapping[str, str] | None = None, exports: Mapping[str, str] | None = None,
                  runtime: str | None = None) -> dict[str, EnvSetting]:
    """The environment vLLM starts with, lowest first, each value with where it comes from. The one computation the
    daemon (preflight, the group's checks, the launch's GPUs and title prefix) and ``sparkd check-config`` share:

    - in a container: the image's ENV (``image_env``, when preflight has read it), then ``[container] env``;
    - on the host (the process runtime): sparkd's own environment (``host_env``, default this process's: under
      systemd the unit's ``Environment=``), which vLLM inherits;
    - then what the launch script exports (``exports``, default :func:`render_env`: the recommended env, the node
      address, ``[launch] env``).

    ``runtime``: the runtime's name when the caller holds one (default ``[runtime]``)."""
    in_container = cfg.runtime.in_container if runtime is None else runtime != "process"
    out: dict[str, EnvSetting] = {}
    if in_container:
        out.update({k: EnvSetting(v, f"the ENV of image {cfg.container.image}") for k, v in (image_env or {}).items()})
        out.update({k: EnvSetting(v, f"container.env.{k}") for k, v in cfg.container.env.items()})
    else:
        inherited = os.environ if host_env is None else host_env
        out.update({k: EnvSetting(v, f"sparkd's own environment ({k}, inherited by vLLM)")
                    for k, v in inherited.items()})
    for name, value in (render_env(cfg) if exports is None else exports).items():
        if name in cfg.launch.env:
            key = f"launch.env.{name}"
        elif name == "VLLM_HOST_IP":
            key = "node.address"
        else:
            key = "launch.default_env"
        out[name] = EnvSetting(value, key)
    return out


def env_values(settings: Mapping[str, EnvSetting]) -> dict[str, str]:
    return {k: s.value for k, s in settings.items()}


def nccl_ib_in_play(env: Mapping[str, str], nnodes: int) -> bool:
    """NCCL will use its InfiniBand/RoCE transport: named HCAs, or a multi-node launch without
    ``NCCL_IB_DISABLE=1`` (NCCL then uses any RDMA device it finds, and falls back to sockets quietly)."""
    if env.get("NCCL_IB_DISABLE", "0").strip() == "1":
        return False
    return bool(env.get("NCCL_IB_HCA")) or nnodes > 1


EXECUTE_TIMEOUT_ENV = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"


def health_settings(cfg: Config) -> HealthConfig:
    """`[health]` with `execute_timeout_s` taken from the launch environment when the config leaves it unset: the
    value vLLM will run with, so the stall check waits out what vLLM itself would survive."""
    if cfg.health.execute_timeout_s is not None:
        return cfg.health
    value = render_env(cfg).get(EXECUTE_TIMEOUT_ENV, "").strip()
    if not value.isdigit() or int(value) <= 0:
        return cfg.health  # unset (vLLM's default applies) or not an integer (lint reports it)
    return cfg.health.model_copy(update={"execute_timeout_s": float(value)})


def render(cfg: Config) -> LaunchSpec:
    """The argv and environment of the launch. With ``[launch] script`` set, the user's script is run."""
    launch = cfg.launch
    if launch.script:
        argv = ["bash", launch.script, *launch.extra_args]
    else:
        argv = [launch.executable]
        if launch.subcommand:
            argv.append(launch.subcommand)
        argv.append(launch.model)
        argv += render_flags(cfg)
    env = render_env(cfg)
    secret_env = {name: env.pop(name) for name in list(env) if is_secret_name(name, launch.secret_env)}
    key = configured_api_key(cfg)
    if key is not None:
        secret_env[API_KEY_ENV] = key
    probe = probe_dir(cfg)
    if probe is not None:
        env[DIR_ENV] = str(probe)
        if cfg.stop.drain_s > 0:  # the plugin's drain takes in what vLLM accepted before its SIGTERM
            env[ADMIT_ENV] = "1"
    return LaunchSpec(argv=tuple(argv), env=env, config_hash=cfg.launch_hash(), secret_env=secret_env,
                      env_edits=probe_edits() if probe is not None else (), probe_dir=str(probe) if probe else None,
                      drain_s=cfg.stop.drain_s)


def configured_api_key(cfg: Config) -> str | None:
    """``[launch] api_key``, or the content of ``api_key_file`` — "" when that cannot be read (or is not root's
    alone), so the launch script refuses to start vLLM rather than serve it without its key."""
    launch = cfg.launch
    if launch.api_key_file is None:
        return launch.api_key
    try:
        return read_secret_file(launch.api_key_file, "[launch] api_key_file")
    except SecretFileProblem:
        return ""


def api_key(cfg: Config) -> str | None:
    """The key vLLM's clients must send (sparkd's probes do): the configured one, else ``VLLM_API_KEY`` from the
    launch's or the container's environment."""
    return configured_api_key(cfg) or render_env(cfg).get(API_KEY_ENV) or (
        cfg.container.env.get(API_KEY_ENV) if cfg.runtime.in_container else None)


def secret_values(cfg: Config) -> list[str]:
    """Every secret value the config holds or names (the API key, secret-named environment values, the webhooks'
    URLs)."""
    names = cfg.launch.secret_env
    env = {**cfg.container.env, **render_env(cfg)}
    return ([v for k, v in env.items() if is_secret_name(k, names)] + [k for k in (api_key(cfg),) if k]
            + notify_secrets(cfg.notify))


def render_script(spec: LaunchSpec, *, source: str = "the sparkd config") -> str:
    """A bash script that exports the environment and execs the argv, every word quoted once."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Rendered by sparkd {__version__} from {source} (launch hash {spec.config_hash}).",
        "# sparkd rewrites this file before every launch; change the config, not this file.",
        "set -euo pipefail",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in spec.env.items()]
    lines += [edit.shell() for edit in spec.env_edits]
    for name in sorted(spec.secret_env):  # absent: refuse to start rather than serve without the key
        lines.append(f': "${{{name}:?is not set: sparkd passes it in the environment, not in this file}}"')
    words = [shlex.quote(word) for word in spec.argv]
    lines.append("exec " + " \\\n    ".join(_pair_flags(words)))
    return "\n".join(lines) + "\n"


def _pair_flags(words: list[str]) -> list[str]:
    # One line for the command, then one per `--flag value`, for a readable script; quoting is per word.
    out: list[str] = []
    for word in words:
        if not out or word.startswith("--"):
            out.append(word)
        else:
            out[-1] += " " + word
    return out
