"""sparkd's step probe in the stand-in (issue 38): each process that steps keeps the file the real vLLM's would.

The stand-in loads the probe the way vLLM loads the ``sparkd-vllm-probe`` plugin — its ``sparkd_probe`` entry point in
the ``vllm.general_plugins`` group, found on the ``PYTHONPATH`` sparkd's launch gives, skipped when ``VLLM_PLUGINS``
is set without it, and only with ``SPARKD_PROBE_DIR`` set — and writes with the plugin's own writer
(``sparkd_vllm_probe.writer``): the format is the plugin's, never copied here. Where it steps: the EngineCore at each
request's step, each worker rank at its part of it (a rank that waits for a silent peer marks the collective), and
a headless node's ranks when rank 0 announces the step over the coupling (``rendezvous``), so a frozen remote rank
falls behind in its file as a real one does. A step carries one token (a decode step). Any failure turns the probe
off in that process, as the plugin does, and the stand-in runs on.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

GROUP = "vllm.general_plugins"
PLUGIN = "sparkd_probe"
DIR_ENV = "SPARKD_PROBE_DIR"


def _writer_module() -> ModuleType | None:
    """The plugin's writer module, when vLLM would load the plugin in this process."""
    if not os.environ.get(DIR_ENV):
        return None
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN not in allowed.split(","):
        return None
    for point in entry_points(group=GROUP):
        if point.name == PLUGIN:
            try:
                return importlib.import_module(point.value.split(":", 1)[0] + ".writer")
            except ImportError:
                return None
    return None


class Steps:
    """One process's step file through the plugin's writer; every call does nothing once the probe is off."""

    def __init__(self, writer: Any | None) -> None:
        self._writer = writer

    def _do(self, method: str, *args: Any) -> None:
        writer = self._writer
        if writer is None:
            return
        try:
            getattr(writer, method)(*args)
        except Exception as exc:  # the probe's failure never stops the stand-in
            self._writer = None
            with contextlib.suppress(Exception):
                writer.off(f"the stand-in's step {method} failed: {exc!r}")

    def begin(self, tokens: int = 1) -> None:
        self._do("begin", tokens)

    def end(self, held: int = -1) -> None:
        self._do("end", held)

    def collective(self) -> None:
        self._do("collective")

    @property
    def on(self) -> bool:
        return self._writer is not None


def steps(role: str, rank: int, *, local_rank: int = -1, world_size: int = 1, title: str = "",
          vllm: str = "") -> Steps:
    """The step file of this process's ``role`` (``engine`` or ``worker``) and ``rank``; an inert one when the
    probe is not loaded here or its file cannot be made."""
    module = _writer_module()
    if module is None:
        return Steps(None)
    layout = module.layout
    try:
        writer = module.StepWriter(os.environ[DIR_ENV], layout.ENGINE if role == "engine" else layout.WORKER, rank,
                                   local_rank=local_rank, world_size=world_size, title=title, vllm=vllm)
    except Exception:
        return Steps(None)
    return Steps(writer)
