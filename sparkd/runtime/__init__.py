"""Ways of running vLLM: ``docker-exec``, ``docker-run`` and ``process``, behind one interface (base.Runtime).

A new way (podman, say) is one module with a ``Runtime`` subclass, one ``RuntimeKind`` member, one entry in
``RUNTIMES`` and one entry in tests/integration/test_runtime_contract.py.
"""

from __future__ import annotations

import importlib

from sparkd.config import Config, RuntimeKind
from sparkd.runtime.base import Runtime

# Imported on use: the docker SDK stays out of a process-runtime daemon.
RUNTIMES: dict[RuntimeKind, str] = {
    RuntimeKind.process: "sparkd.runtime.process:ProcessRuntime",
    RuntimeKind.docker_exec: "sparkd.runtime.docker_exec:DockerExecRuntime",
    RuntimeKind.docker_run: "sparkd.runtime.docker_run:DockerRunRuntime",
}


def runtime_class(kind: RuntimeKind) -> type[Runtime]:
    module, _, name = RUNTIMES[kind].partition(":")
    cls: type[Runtime] = getattr(importlib.import_module(module), name)
    return cls


def make_runtime(cfg: Config, *, rehearse: bool = False) -> Runtime:
    """The runtime ``cfg.runtime`` names, made from the config."""
    return runtime_class(cfg.runtime).from_config(cfg, rehearse=rehearse)
