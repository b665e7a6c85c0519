"""Ways of running vLLM: ``docker-exec``, ``docker-run`` and ``process``, behind one interface (base.Runtime).

Each way is the module named by its ``RuntimeKind`` value (``docker-exec`` is ``sparkd/runtime/docker_exec.py``),
whose ``RUNTIME`` is its ``Runtime`` subclass; it is imported when a config names it, so the docker SDK stays out
of a process-runtime daemon. A new way (podman, say) is one module and one ``RuntimeKind`` member
(sparkd/config/sections.py), and one entry in tests/integration/test_runtime_contract.py.
"""

from __future__ import annotations

import importlib

from sparkd.config import Config, RuntimeKind
from sparkd.runtime.base import Runtime


def runtime_module(kind: RuntimeKind) -> str:
    """The module of a way of running vLLM: its kind's value, ``-`` as ``_``."""
    return f"{__name__}.{kind.value.replace('-', '_')}"


def runtime_class(kind: RuntimeKind) -> type[Runtime]:
    cls: type[Runtime] = importlib.import_module(runtime_module(kind)).RUNTIME
    return cls


def make_runtime(cfg: Config, *, rehearse: bool = False) -> Runtime:
    """The runtime ``cfg.runtime`` names, made from the config."""
    return runtime_class(cfg.runtime).from_config(cfg, rehearse=rehearse)
