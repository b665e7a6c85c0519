"""Ways of running vLLM: ``docker-exec``, ``docker-run`` and ``process``, behind one interface."""

from __future__ import annotations

from sparkd.config import Config, RuntimeKind
from sparkd.runtime.base import Runtime


def make_runtime(cfg: Config, *, rehearse: bool = False) -> Runtime:
    if cfg.runtime is RuntimeKind.process:
        from sparkd.runtime.process import ProcessRuntime

        return ProcessRuntime(cfg.paths.state_dir / "run")
    if cfg.runtime is RuntimeKind.docker_exec:
        from sparkd.runtime.docker_exec import DockerExecRuntime

        return DockerExecRuntime(cfg, rehearse=rehearse)
    from sparkd.runtime.docker_run import DockerRunRuntime

    return DockerRunRuntime(cfg, rehearse=rehearse)
