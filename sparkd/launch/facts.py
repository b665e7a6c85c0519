"""The facts of a launch that its config alone gives the classifier: the script or binary the launch execs, vLLM's
API port, the group's master port. The daemon adds what it observed (:mod:`sparkd.daemon.effects.evidence`);
``sparkd explain --config`` classifies with these alone, so a pasted log gets the daemon's sentence. Pure."""

from __future__ import annotations

from sparkd.config import Config
from sparkd.launch.render import LaunchSpec, render
from sparkd.supervisor.context import ClassifyContext

__all__ = ["config_context", "launch_target"]


def launch_target(spec: LaunchSpec) -> str:
    """The script (``bash SCRIPT ...``) or the binary the launch execs."""
    return spec.argv[1] if spec.argv[0] == "bash" else spec.argv[0]


def config_context(cfg: Config) -> ClassifyContext:
    """What the daemon knows of ``cfg``'s launch before anything happens: the launch target, the API port, and the
    torch.distributed master port when the launch is a group's (``nnodes > 1``)."""
    return ClassifyContext(launch_target=launch_target(render(cfg)), api_port=cfg.launch.port,
                           master_port=cfg.master_port if cfg.nnodes > 1 else None)
