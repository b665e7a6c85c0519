"""Known-bad and recommended settings from the field reports, judged on the effective launch.

Known-bad settings are errors unless the rule id is listed in ``[lint] allow``; missing recommended
settings are warnings. Every finding names the config key it is about.

The environment judged is the one vLLM starts with (:func:`sparkd.launch.render.effective_env`, as the daemon
computes it): in a container the image's ENV (when preflight has read it) and ``[container] env``, on the host
sparkd's own environment (which vLLM inherits), then the launch script's exports (``[launch] env`` and the
recommended env) and, in script mode, what the user's script exports. The field's traps
(:mod:`sparkd.launch.traps`) are judged on the same, and on what this node measured when the caller says. In script
mode the script's own serve line is read for the rank, ``--headless`` and ``--nnodes`` (sparkd renders none of them
there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from sparkd.config import Config, Role
from sparkd.config.profiles import profile_needs_cuda_graphs
from sparkd.launch.compilecache import unpersisted_caches
from sparkd.launch.finding import Finding, Level
from sparkd.launch.probe import too_old, version_of_tag
from sparkd.launch.render import (
    EXECUTE_TIMEOUT_ENV,
    JSON_FLAGS,
    RECOMMENDED_ENV,
    SWITCH_FLAGS,
    TRISTATE_FLAGS,
    VALUE_FLAGS,
    EnvSetting,
    effective_env,
    flag,
    nccl_ib_in_play,
    render_flags,
)
from sparkd.launch.script import ScriptFacts, script_facts
from sparkd.launch.secretargs import RULE as SECRET_ARGS_RULE
from sparkd.launch.secretargs import secret_args
from sparkd.launch.stoplint import drain_rules
from sparkd.launch.traps import NodeFacts, field_traps

__all__ = ["Finding", "Level", "ScriptReader", "errors", "lint", "read_host_file", "script_rank_rules"]


ScriptReader = Callable[[str], str | None]


def read_host_file(path: str) -> str | None:
    """Read a user script from the host; None when it is not there (it may live in the container)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def lint(cfg: Config, *, read_script: ScriptReader = read_host_file,
         image_env: Mapping[str, str] | None = None, host_env: Mapping[str, str] | None = None,
         node: NodeFacts | None = None) -> list[Finding]:
    """Every finding on ``cfg``; ``image_env``: the image's ENV when known (preflight reads it from the engine);
    ``host_env``: sparkd's own environment, which vLLM inherits on the host (default this process's); ``node``: what
    this node measured (its start times), for the rules that judge by it."""
    allowed = set(cfg.lint.allow)
    text = read_script(cfg.launch.script) if cfg.launch.script else None
    facts = script_facts(text, cfg.launch.extra_args) if text is not None else None
    env = effective_env(cfg, image_env, host_env=host_env)
    if facts is not None:
        env.update({k: EnvSetting(v, f"launch.script ({k} exported by {cfg.launch.script})")
                    for k, v in facts.exports.items()})
    findings = [*_rank_rules(cfg), *_env_rules(cfg, env), *_flag_rules(cfg), *_script_rules(cfg, text, facts),
                *_container_rules(cfg, env), *_secret_arg_rules(cfg), *_traps(cfg, env, facts, node),
                *probe_rules(cfg, version_of_tag(cfg.container.image) if cfg.runtime.in_container else None,
                             "its image's tag"), *drain_rules(cfg, facts)]
    return [f for f in findings if not (f.level is Level.error and f.rule in allowed)]


def _traps(cfg: Config, env: Mapping[str, EnvSetting], facts: ScriptFacts | None,
           node: NodeFacts | None) -> Iterator[Finding]:
    """The field's known traps (:mod:`sparkd.launch.traps`), on the serve command's flags as they will run."""
    if cfg.launch.script:
        words = list(facts.command) if facts is not None else cfg.launch.extra_args
    else:
        words = render_flags(cfg)
    for rule, level, key, message in field_traps(cfg, env, words, node):
        yield Finding(rule, Level(level), key, message)


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


def _env_rules(cfg: Config, env: Mapping[str, EnvSetting]) -> Iterator[Finding]:
    fork = env.get("VLLM_WORKER_MULTIPROC_METHOD")
    if fork is not None and fork.value == "fork":
        yield Finding("multiproc-fork", Level.error, fork.key,
                      "VLLM_WORKER_MULTIPROC_METHOD=fork crashes DeepSeek-V4 on GB10 (AttributeError: "
                      "'ShmRingBuffer' object has no attribute 'shared_memory'); leave it unset or use 'spawn'")
    timeout = env.get(EXECUTE_TIMEOUT_ENV)
    if timeout is not None and not (timeout.value.strip().isdigit() and int(timeout.value) > 0):
        yield Finding("execute-timeout-not-integer", Level.error, timeout.key,
                      f"{timeout.value!r} is not a positive whole number of seconds; vLLM reads it with int() and "
                      "fails at startup")
    for name, why in _RECOMMENDED.items():
        rule, key = f"missing-{name.lower().replace('_', '-')}", f"launch.env.{name}"
        value = RECOMMENDED_ENV[name]
        if name not in env:
            yield Finding(rule, Level.warning, key, f"recommended {name}={value} is not set ({why})")
        elif name.startswith("UCX_") and env[name].value != value:
            yield Finding(rule, Level.warning, env[name].key, f"is {env[name].value!r}; the field runs {value!r} "
                          f"({why})")
        elif name == "VLLM_ENGINE_READY_TIMEOUT_S" and _seconds(env[name].value) < int(value):
            yield Finding(rule, Level.warning, env[name].key, f"is {env[name].value!r}; a cold start takes 8-10 "
                          f"minutes, the field runs {value} ({why})")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


# Recommended settings whose absence is a warning, and why the field wants them.
_RECOMMENDED = {
    "UCX_MEM_MMAP_HOOK_MODE": "UCX's mmap hooks leak unified memory per request until the host freezes",
    "UCX_RCACHE_MAX_UNRELEASED": "bounds UCX's registration cache; part of the leak fix",
    "OMP_NUM_THREADS": "vLLM otherwise reduces Torch parallelism with a warning and CPU contention",
    "VLLM_ENGINE_READY_TIMEOUT_S": "vLLM gives up waiting for its engine after 600 s by default, before a "
                                   "DeepSeek-V4 cold start is done",
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
                          "sparkd sees engine steps only in the executor's wait lines (with tensor or pipeline "
                          "parallelism: a wedge is caught after 60 s of one step); on one GPU a wedge is only "
                          "caught by the canary after health.busy_grace_s")
        elif arg.lstrip().startswith(("{", "[")):
            yield Finding("json-in-extra-args", Level.warning, f"launch.extra_args[{i}]",
                          "a JSON value in extra_args; prefer a typed TOML table where one exists")


def _script_rules(cfg: Config, text: str | None, facts: ScriptFacts | None) -> Iterator[Finding]:
    script = cfg.launch.script
    if not script or text is None or facts is None:
        return  # no script, or it is not on this host: checked where it runs, by preflight
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
    yield from script_rank_rules(cfg, facts)


def script_rank_rules(cfg: Config, facts: ScriptFacts) -> Iterator[Finding]:
    """The rank rules on a user script's serve line: what sparkd renders in typed mode, read from the script."""
    script = cfg.launch.script
    if not facts.command:
        return
    role, rank = cfg.node.role, cfg.node_rank
    said = facts.literal_int("--node-rank")
    if said is not None and said != rank:
        yield Finding("rank-role-mismatch", Level.error, "launch.script",
                      f"{script} launches --node-rank {said}, but this node's rank is {rank} (node.rank)")
    nnodes = facts.literal_int("--nnodes")
    if nnodes is not None and nnodes != cfg.nnodes and (cfg.cluster.nnodes or cfg.launch.nnodes):
        yield Finding("rank-role-mismatch", Level.error, "launch.script",
                      f"{script} launches --nnodes {nnodes}, the config says {cfg.nnodes}")
    headless = facts.mentions("--headless")
    if role is Role.worker and not headless:
        yield Finding("worker-not-headless", Level.error, "launch.script",
                      f"{script} does not pass --headless on a worker node; without it the worker starts a second "
                      "API server and the pair never forms")
    if role is not Role.worker and "--headless" in facts.command:
        yield Finding("head-headless", Level.error, "launch.script",
                      f"{script} passes --headless on a {role.value} node: it serves the API and rank 0")


def probe_rules(cfg: Config, version: tuple[int, int, int] | None, where: str) -> Iterator[Finding]:
    """The step probe on a vLLM of a known ``version`` (found ``where``): a warning when it is too old to load it."""
    why = too_old(version, where) if cfg.health.step_probe and version is not None else None
    if why is not None:
        yield Finding("probe-vllm-too-old", Level.warning, "health.step_probe", why)


# ---- the container vLLM runs in --------------------------------------------------------------------------------


def _container_rules(cfg: Config, env: Mapping[str, EnvSetting]) -> Iterator[Finding]:
    if not cfg.runtime.in_container:
        return  # on the host the caches persist and the devices are the host's
    values = {k: s.value for k, s in env.items()}
    for what, path in unpersisted_caches(cfg, values).items():
        yield Finding("compile-cache-not-persisted", Level.warning, "container.mounts",
                      f"{what} {path} is not on a writable mount: it lives in the container's own layer, lost "
                      "whenever the container is recreated (`sparkctl recreate`, a new image), so the next start "
                      "compiles again (the field measured 39% slower decode before the cache is warm); mount a "
                      "host directory there")
    cc = cfg.container
    if nccl_ib_in_play(values, cfg.nnodes) and not cc.privileged:
        if not any(d.split(":")[1].startswith("/dev/infiniband") for d in cc.devices):
            yield Finding("rdma-no-devices", Level.warning, "container.devices",
                          "NCCL will use RDMA but the container gets no /dev/infiniband: set devices = "
                          "[\"/dev/infiniband\"] (or privileged = true), or NCCL falls back to sockets or fails")
        memlock = cc.ulimits.get("memlock")
        if (memlock is None or memlock.soft != -1) and "IPC_LOCK" not in cc.cap_add:
            yield Finding("rdma-memlock", Level.warning, "container.ulimits",
                          "NCCL registers memory for RDMA: without memlock = -1 it fails with 'ibv_reg_mr ... "
                          "Cannot allocate memory' (field report 001); set ulimits = { memlock = -1 }")


def _secret_arg_rules(cfg: Config) -> Iterator[Finding]:
    """A secret flag with its value in ``[launch] extra_args`` (sparkd.launch.secretargs)."""
    for _, sentence in secret_args(cfg.launch.extra_args):
        yield Finding(SECRET_ARGS_RULE, Level.error, "launch.extra_args", sentence)
