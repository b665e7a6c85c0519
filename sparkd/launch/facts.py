"""The facts of a launch that its config alone gives the classifier: the script or binary the launch execs, vLLM's
API port, the group's master port, whether the launch spans nodes. The daemon adds what it observed
(:mod:`sparkd.daemon.effects.evidence`); ``sparkd explain --config`` classifies with these alone, so a pasted log gets
the daemon's sentence. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparkd.config import Config
from sparkd.launch.render import LaunchSpec, render
from sparkd.supervisor.context import ClassifyContext

__all__ = ["config_context", "launch_group", "launch_target"]

# What may take a launch sparkd renders for one node onto others: its multi-node and data-parallel flags passed through
# `extra_args`, and an executor other than vLLM's own processes (Ray's joins whatever cluster it finds: `RAY_ADDRESS`,
# or one started on the node)
_SPANNING_FLAGS = frozenset({
    "--nnodes", "--node-rank", "--headless", "--master-addr", "--data-parallel-address", "--data-parallel-size-local",
    "--data-parallel-start-rank", "--data-parallel-rpc-port", "--data-parallel-hybrid-lb",
    "--data-parallel-external-lb"})
_EXECUTOR_FLAG, _LOCAL_EXECUTORS = "--distributed-executor-backend", frozenset({"mp", "uni"})
_SPANNING_ENV = ("RAY_ADDRESS",)


def launch_target(spec: LaunchSpec) -> str:
    """The script (``bash SCRIPT ...``) or the binary the launch execs."""
    return spec.argv[1] if spec.argv[0] == "bash" else spec.argv[0]


def launch_group(cfg: Config, spec: LaunchSpec) -> bool | None:
    """Whether the launch spans nodes: True for a group (``nnodes > 1``, or peers); False where sparkd renders vLLM on
    this node alone; None where it cannot tell (the user's own launch script, flags or variables that may take the
    launch onto other nodes)."""
    if cfg.nnodes > 1 or cfg.cluster.peers:
        return True
    env: Mapping[str, str] = {**cfg.container.env, **spec.env}
    if cfg.launch.script or _spanning(spec.argv) or any(name in env for name in _SPANNING_ENV):
        return None
    return False


def _spanning(argv: Sequence[str]) -> bool:
    for at, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in _SPANNING_FLAGS:
            return True
        if name == _EXECUTOR_FLAG:
            value = value if equals else (argv[at + 1] if at + 1 < len(argv) else "")
            if value not in _LOCAL_EXECUTORS:
                return True
    return False


def config_context(cfg: Config) -> ClassifyContext:
    """What the daemon knows of ``cfg``'s launch before anything happens: the launch target, the API port, the
    torch.distributed master port when the launch is a group's (``nnodes > 1``), and whether it spans nodes (a rank
    lost on a node that runs vLLM alone is one of its own processes, never a peer)."""
    spec = render(cfg)
    return ClassifyContext(launch_target=launch_target(spec), api_port=cfg.launch.port,
                           master_port=cfg.master_port if cfg.nnodes > 1 else None, group=launch_group(cfg, spec))
