"""Known-bad and recommended settings from the field reports.

Known-bad settings are errors unless the rule id is listed in ``[lint] allow``; missing recommended
settings are warnings. Every finding names the config key it is about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sparkd.config import Config, Role
from sparkd.launch import (
    EXECUTE_TIMEOUT_ENV,
    JSON_FLAGS,
    RECOMMENDED_ENV,
    SWITCH_FLAGS,
    TRISTATE_FLAGS,
    VALUE_FLAGS,
    flag,
    render_env,
)
from sparkd.profiles import profile_needs_cuda_graphs


class Level(StrEnum):
    error = "error"
    warning = "warning"


@dataclass(frozen=True)
class Finding:
    rule: str
    level: Level
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.value}: {self.key}: {self.message} [{self.rule}]"


ScriptReader = Callable[[str], str | None]


def read_host_file(path: str) -> str | None:
    """Read a user script from the host; None when it is not there (it may live in the container)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def lint(cfg: Config, *, read_script: ScriptReader = read_host_file) -> list[Finding]:
    allowed = set(cfg.lint.allow)
    findings = [*_rank_rules(cfg), *_env_rules(cfg), *_flag_rules(cfg), *_script_rules(cfg, read_script)]
    return [f for f in findings if not (f.level is Level.error and f.rule in allowed)]


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level is Level.error]


def _rank_rules(cfg: Config) -> Iterator[Finding]:
    role, headless = cfg.node.role, cfg.headless
    if role is Role.worker and not headless:
        yield Finding("worker-not-headless", Level.error, "launch.headless",
                      "a worker node must run --headless; without it the worker starts a second API server "
                      "and the pair never forms")
    if role is not Role.worker and headless:
        yield Finding("head-headless", Level.error, "launch.headless",
                      f"a {role.value} node must not run --headless: it serves the API and rank 0")
    rank = cfg.node_rank
    key = "launch.node_rank" if cfg.launch.node_rank is not None else "node.rank"
    if role in (Role.head, Role.single) and rank != 0:
        yield Finding("rank-role-mismatch", Level.error, key, f"a {role.value} node has rank 0, not {rank}")
    if role is Role.worker and rank == 0:
        yield Finding("rank-role-mismatch", Level.error, key, "a worker node needs rank >= 1 (the head is 0)")
    if cfg.launch.node_rank is not None and cfg.launch.node_rank != cfg.node.rank:
        yield Finding("rank-role-mismatch", Level.error, "launch.node_rank",
                      f"{cfg.launch.node_rank} differs from node.rank = {cfg.node.rank}")
    if role is Role.single and cfg.nnodes > 1:
        yield Finding("single-multinode", Level.error, "node.role",
                      f"role 'single' with nnodes = {cfg.nnodes}; use 'head' or 'worker'")
    if cfg.nnodes > 1 and not cfg.master_addr:
        yield Finding("missing-master-addr", Level.error, "cluster.master_addr",
                      "a multi-node launch needs the head's fabric address")
    if cfg.cluster.peers and cfg.nnodes > 1 and role is not Role.single and cfg.api.token_file is None:
        yield Finding("peers-without-token", Level.error, "api.token_file",
                      "cluster.peers is set but the peer API has no token: the pair's daemons could not talk; "
                      "put the same secret in a file on both nodes and name it here")
    if cfg.cluster.peers and cfg.nnodes > 1 and not cfg.api.port:
        yield Finding("peers-without-port", Level.error, "api.port",
                      "cluster.peers is set but api.port = 0: the peer API needs the TCP port")
    if role is not Role.single and cfg.nnodes > 1 and rank >= cfg.nnodes:
        yield Finding("rank-role-mismatch", Level.error, key,
                      f"rank {rank} is not below nnodes = {cfg.nnodes}")


def _env_rules(cfg: Config) -> Iterator[Finding]:
    env = render_env(cfg)
    if env.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork":
        yield Finding("multiproc-fork", Level.error, "launch.env.VLLM_WORKER_MULTIPROC_METHOD",
                      "'fork' crashes DeepSeek-V4 on GB10 (AttributeError: 'ShmRingBuffer' object has no "
                      "attribute 'shared_memory'); leave it unset or use 'spawn'")
    timeout = env.get(EXECUTE_TIMEOUT_ENV)
    if timeout is not None and not (timeout.strip().isdigit() and int(timeout) > 0):
        yield Finding("execute-timeout-not-integer", Level.error, f"launch.env.{EXECUTE_TIMEOUT_ENV}",
                      f"{timeout!r} is not a positive whole number of seconds; vLLM reads it with int() and "
                      "fails at startup")
    for name, why in _RECOMMENDED.items():
        rule, key = f"missing-{name.lower().replace('_', '-')}", f"launch.env.{name}"
        value = RECOMMENDED_ENV[name]
        if name not in env:
            yield Finding(rule, Level.warning, key, f"recommended {name}={value} is not set ({why})")
        elif name.startswith("UCX_") and env[name] != value:
            yield Finding(rule, Level.warning, key, f"is {env[name]!r}; the field runs {value!r} ({why})")


# Recommended settings whose absence is a warning, and why the field wants them.
_RECOMMENDED = {
    "UCX_MEM_MMAP_HOOK_MODE": "UCX's mmap hooks leak unified memory per request until the host freezes",
    "UCX_RCACHE_MAX_UNRELEASED": "bounds UCX's registration cache; part of the leak fix",
    "OMP_NUM_THREADS": "vLLM otherwise reduces Torch parallelism with a warning and CPU contention",
}


def _flag_rules(cfg: Config) -> Iterator[Finding]:
    launch = cfg.launch
    graphs_mode = (launch.compilation_config or {}).get("cudagraph_mode")
    wants_graphs = profile_needs_cuda_graphs(launch.profile) or graphs_mode not in (None, "NONE")
    if launch.enforce_eager and wants_graphs:
        yield Finding("enforce-eager-cuda-graphs", Level.warning, "launch.enforce_eager",
                      "--enforce-eager disables the CUDA graphs this profile/compilation_config relies on; "
                      "expect a large decode slowdown")
    typed = {flag(n) for n in (*VALUE_FLAGS, *SWITCH_FLAGS, *TRISTATE_FLAGS, *JSON_FLAGS)}
    typed |= {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"}
    for i, arg in enumerate(launch.extra_args):
        name = arg.split("=", 1)[0]
        if name in typed:
            yield Finding("extra-arg-duplicates-field", Level.error, f"launch.extra_args[{i}]",
                          f"{name} is a typed setting; set launch.{name[2:].replace('-', '_')} instead "
                          "so the config stays the one source of truth")
        elif name == "--disable-log-stats":
            yield Finding("disable-log-stats", Level.warning, f"launch.extra_args[{i}]",
                          "--disable-log-stats removes every vllm:* metric and vLLM's throughput log line, so "
                          "sparkd cannot see engine steps: a wedge is only caught by the canary after "
                          "health.busy_grace_s")
        elif arg.lstrip().startswith(("{", "[")):
            yield Finding("json-in-extra-args", Level.warning, f"launch.extra_args[{i}]",
                          "a JSON value in extra_args; prefer a typed TOML table where one exists")


def _script_rules(cfg: Config, read_script: ScriptReader) -> Iterator[Finding]:
    script = cfg.launch.script
    if not script:
        return
    text = read_script(script)
    if text is None:
        return  # checked where it runs, by preflight
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        yield Finding("script-empty", Level.error, "launch.script", f"{script} is empty")
    elif lines[-1].startswith("#"):
        yield Finding("script-ends-in-comment", Level.error, "launch.script",
                      f"the last line of {script} is a comment ({lines[-1][:60]!r}); per-node arguments "
                      "appended to the command would be commented out")
    elif lines[-1].endswith("\\"):
        yield Finding("script-ends-in-continuation", Level.error, "launch.script",
                      f"the last line of {script} ends in a line continuation")
