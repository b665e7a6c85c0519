"""sparkd-vllm-probe: a vLLM general plugin that records each engine step of every vLLM process that steps.

vLLM calls :func:`register` (its ``vllm.general_plugins`` entry point, ``sparkd_probe``) in the processes that load
plugins. With ``SPARKD_PROBE_DIR`` set (sparkd's launch sets it) the probe wraps vLLM's step methods
(:mod:`.hooks`) so that the EngineCore and each worker rank keep a 512-byte file there (:mod:`.layout`, written by
:mod:`.writer`): the step number, when the current step began and the last one ended, the phase, the rank, the PID.
sparkd reads the files to tell which rank is stuck. Nothing here imports beyond the standard library and vLLM; any
failure turns the probe off in that process with one warning, and vLLM runs on.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from typing import Any

from . import layout
from .hooks import PATCHES, Probe, log

__all__ = ["register"]

_PROBE: Probe | None = None


class _PatchOnImport:
    """A ``sys.meta_path`` finder that patches the probe's modules right after vLLM imports them."""

    def __init__(self, probe: Probe, pending: dict[str, Any]) -> None:
        self.probe = probe
        self.pending = pending
        self.local = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        patch = self.pending.get(fullname)
        if patch is None or getattr(self.local, "busy", False):
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
            _apply(self.probe, patch, module)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)

        loader.exec_module = exec_module
        return spec


def _apply(probe: Probe, patch: Any, module: Any) -> None:
    if probe.off:
        return
    try:
        patch(probe, module)
    except Exception as exc:
        probe.fail(f"cannot wrap {module.__name__}: {exc!r}")


def register() -> None:
    """vLLM's entry point: set the probe up in this process (once; a forked child inherits it)."""
    global _PROBE
    if _PROBE is not None:
        return
    directory = os.environ.get(layout.DIR_ENV, "")
    if not directory:
        return  # not launched by sparkd: nothing to do
    try:
        if not (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
            log.warning("sparkd probe: off: %s=%s is not a directory this process may write; vLLM runs on "
                        "without it", layout.DIR_ENV, directory)
            return
        _PROBE = probe = Probe(directory)
        pending = {}
        for name, patch in PATCHES.items():
            module = sys.modules.get(name)
            if module is None:
                pending[name] = patch
            else:
                _apply(probe, patch, module)
        if pending and not probe.off:
            sys.meta_path.insert(0, _PatchOnImport(probe, pending))
    except Exception as exc:  # never let the probe stop vLLM
        log.warning("sparkd probe: off: it could not set itself up (%r); vLLM runs on without it", exc)
