"""sparkd-vllm-probe: a vLLM general plugin that records each engine step of every vLLM process that steps.

vLLM calls :func:`register` (its ``vllm.general_plugins`` entry point, ``sparkd_probe``) in the processes that load
plugins. With ``SPARKD_PROBE_DIR`` set (sparkd's launch sets it) the probe wraps vLLM's step methods
(:mod:`.hooks`) so that the EngineCore and each worker rank keep a 512-byte file there (:mod:`.layout`, written by
:mod:`.writer`): the step number, when the current step began and the last one ended, the phase, the rank, the PID.
sparkd reads the files to tell which rank is stuck. With ``SPARKD_DRAIN_ADMIT=1`` (a launch with a drain) the
engine core's drain also takes in the requests vLLM accepted before its SIGTERM (:mod:`.admit`). Nothing here imports
beyond the standard library and vLLM; any failure turns the probe (or the admission) off in that process with one
warning, and vLLM runs on.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from . import layout
from .admit import ADMIT_ENV, patch_admit
from .hooks import PATCHES, Probe, log

__all__ = ["register"]

_REGISTERED = False

Patch = Callable[[Any], None]  # what is done to a module of vLLM's once it is imported


class _PatchOnImport:
    """A ``sys.meta_path`` finder that patches the named modules right after vLLM imports them."""

    def __init__(self, pending: dict[str, list[Patch]]) -> None:
        self.pending = pending
        self.local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        patches = self.pending.get(fullname)
        if patches is None or getattr(self.local, "busy", False):
            return None
        self.local.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.local.busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.pending.pop(fullname, None)
            for patch in patches:
                patch(module)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)

        loader.exec_module = exec_module
        return spec


def _probing(probe: Probe, patch: Callable[[Probe, Any], None]) -> Patch:
    def apply(module: Any) -> None:
        if probe.off:
            return
        try:
            patch(probe, module)
        except Exception as exc:
            probe.fail(f"cannot wrap {module.__name__}: {exc!r}")
    return apply


def _admitting(module: Any) -> None:
    try:
        patch_admit(module)
    except Exception as exc:
        log.warning("sparkd drain: off: cannot wrap %s (%r); vLLM drains as it does", module.__name__, exc)


def _step_probe() -> dict[str, Patch]:
    """The step probe's patches, when ``SPARKD_PROBE_DIR`` names a directory this process may write."""
    directory = os.environ.get(layout.DIR_ENV, "")
    if not directory:
        return {}
    if not (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
        log.warning("sparkd probe: off: %s=%s is not a directory this process may write; vLLM runs on "
                    "without it", layout.DIR_ENV, directory)
        return {}
    probe = Probe(directory)
    return {name: _probing(probe, patch) for name, patch in PATCHES.items()}


def register() -> None:
    """vLLM's entry point: set the probe and the drain's admission up in this process (once; a forked child
    inherits them). Neither is set up where sparkd's launch did not ask for it."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    try:
        wanted: dict[str, list[Patch]] = {}
        for name, patch in _step_probe().items():
            wanted.setdefault(name, []).append(patch)
        if os.environ.get(ADMIT_ENV) == "1":
            wanted.setdefault("vllm.v1.engine.core", []).append(_admitting)
        pending = {}
        for name, patches in wanted.items():
            module = sys.modules.get(name)
            if module is None:
                pending[name] = patches
            else:
                for patch in patches:
                    patch(module)
        if pending:
            sys.meta_path.insert(0, _PatchOnImport(pending))
    except Exception as exc:  # never let the plugin stop vLLM
        log.warning("sparkd probe: off: it could not set itself up (%r); vLLM runs on without it", exc)
