"""Where the probe meets vLLM (V1, 0.9 and later): the methods it wraps, and how it stops when anything fails.

- The EngineCore: ``EngineCoreProc._process_engine_step`` is one engine step (schedule, run the model on the
  workers, update); its file is made when the busy loop starts (``run_busy_loop``), so it is there once vLLM is
  ready. After each step it notes the requests the scheduler still holds (running and waiting).
- A worker rank: ``WorkerWrapperBase.execute_model`` is its part of a step (with the scheduled tokens): the forward
  pass and its collectives. vLLM 0.32 samples in a second call (``sample_tokens``) once the engine asks for it; the
  rank's step ends when ``execute_model`` returns, so a rank that did its part and waits for the engine's next call
  reads as done, and an engine core stopped between the two calls is the one inside the step. (On a GPU a rank's
  Python may return before the kernels it queued finish — the CPU waits for them in sampling, or in a copy thread
  with async scheduling —: a collective that does not complete there shows as the engine core inside its step while
  the ranks wait, which the verdict says.)
  The file is made when the worker's busy loop starts (``WorkerProc.worker_busy_loop``), or at its first step where
  the worker runs inside the EngineCore (one GPU: the uni-process executor).
- The API server steps nothing: no file.

vLLM loads general plugins once per process, and a process forked from one that loaded them does not load them
again (vLLM forks its EngineCore and workers by default). So the hooks go on the classes in the first process
that loads the plugin and are inherited: a module already imported is patched at once, one imported later is
patched as it is imported (a finder on ``sys.meta_path`` that only looks at these three names).

Any exception in the probe's own code turns it off in that process: vLLM's methods are put back, the file's phase
says off with the reason, and one warning goes to vLLM's log. vLLM's own exceptions pass through untouched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from . import layout
from .writer import StepWriter

log = logging.getLogger("vllm.sparkd_probe")
_ATTR = "_sparkd_probe"  # on an instance: its StepWriter, or False when none could be made


class Probe:
    """This process's probe: the directory, what it patched (to put back), whether it is off."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.patched: list[tuple[type, str, Any]] = []  # (class, name, what it was: a function, or _ABSENT)
        self.writers: list[tuple[int, StepWriter]] = []  # (the PID that made it, the writer): a fork inherits them
        self.off = False
        self.lock = threading.Lock()

    def wrap(self, cls: type, name: str, make: Callable[[Any], Any]) -> None:
        before = cls.__dict__.get(name, _ABSENT)
        self.patched.append((cls, name, before))
        setattr(cls, name, make(before))

    def writer(self, role: int, rank: int, *, local_rank: int, world_size: int) -> StepWriter | bool:
        if self.off:
            return False
        try:
            w = StepWriter(self.directory, role, rank, local_rank=local_rank, world_size=world_size,
                           title=_title(), vllm=_vllm_version())
        except Exception as exc:  # the directory went away, tmpfs full, ...: vLLM runs on without the probe
            self.fail(f"cannot make its step file in {self.directory}: {exc!r}")
            return False
        self.writers.append((os.getpid(), w))
        log.info("sparkd probe: recording %s %s's steps in %s", layout.ROLES[role], rank, w.path)
        return w

    def fail(self, why: str) -> None:
        """Turn the probe off in this process, once: vLLM's methods back, the files say why, one warning."""
        with self.lock:
            if self.off:
                return
            self.off = True
        for cls, name, before in reversed(self.patched):
            if before is _ABSENT:
                delattr(cls, name)
            else:
                setattr(cls, name, before)
        for pid, w in self.writers:
            if pid == os.getpid():  # a parent's file is the parent's to mark
                with contextlib.suppress(Exception):  # the file may be what failed
                    w.off(why)
        log.warning("sparkd probe: turned off in this process (%s); vLLM runs on without it", why)


_ABSENT = object()


def _title() -> str:
    try:
        import setproctitle

        return str(setproctitle.getproctitle())
    except Exception:
        return os.path.basename(sys.argv[0]) if sys.argv else ""


def _vllm_version() -> str:
    return str(getattr(sys.modules.get("vllm"), "__version__", ""))


def _parallel(config: Any) -> tuple[int, int]:
    """(world size, data-parallel rank) from a VllmConfig; (1, 0) where not there."""
    parallel = getattr(config, "parallel_config", None)
    return int(getattr(parallel, "world_size", 1) or 1), int(getattr(parallel, "data_parallel_rank", 0) or 0)


# ---- the EngineCore ----------------------------------------------------------------------------------------------

def _engine_writer(probe: Probe, engine: Any) -> StepWriter | bool:
    world, dp_rank = _parallel(getattr(engine, "vllm_config", None))
    w = probe.writer(layout.ENGINE, int(getattr(engine, "engine_index", dp_rank) or 0), local_rank=-1,
                     world_size=world)
    setattr(engine, _ATTR, w)
    # one GPU: the uni-process executor runs rank 0 in this process; its file too is there once the engine serves
    rank0 = getattr(getattr(engine, "model_executor", None), "driver_worker", None)
    if rank0 is not None and getattr(type(rank0), _ATTR, False) is None and getattr(rank0, _ATTR) is None:
        _worker_writer(probe, rank0)
    return w


def _held(engine: Any) -> int:
    try:
        scheduler = engine.scheduler
        return len(scheduler.running) + len(scheduler.waiting)
    except Exception:  # another scheduler: the count is unknown, the step is still recorded
        return layout.UNKNOWN


def _target(probe: Probe, module: Any, class_name: str, method: str) -> tuple[type, Any] | None:
    """The class and the method to wrap; None (and the probe off, saying which) when this vLLM has no such thing."""
    cls = getattr(module, class_name, None)
    original = getattr(cls, method, None)
    if cls is None or original is None:
        probe.fail(f"this vLLM has no {class_name}.{method} in {module.__name__}")
        return None
    setattr(cls, _ATTR, None)
    return cls, original


def patch_engine(probe: Probe, module: Any) -> None:
    found = _target(probe, module, "EngineCoreProc", "_process_engine_step")
    if found is None:
        return
    cls, step = found

    def make_step(original: Any) -> Any:
        def _process_engine_step(self: Any) -> Any:
            w = self._sparkd_probe
            if w is None:
                w = _engine_writer(probe, self)
            if w:
                try:
                    w.begin()
                except Exception as exc:
                    probe.fail(f"an engine step's beginning failed: {exc!r}")
                    w = False
            try:
                return original(self)
            finally:
                if w:
                    try:
                        w.end(_held(self))
                    except Exception as exc:
                        probe.fail(f"an engine step's end failed: {exc!r}")
        return _process_engine_step

    probe.wrap(cls, "_process_engine_step", lambda before: make_step(step))
    for loop_cls in [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, cls)]:
        if "run_busy_loop" in loop_cls.__dict__:
            probe.wrap(loop_cls, "run_busy_loop", lambda before: _opening(before, _engine_writer, probe))


def _opening(original: Any, open_writer: Callable[[Probe, Any], Any], probe: Probe,
             owner: Callable[[Any], Any] = lambda self: self) -> Any:
    """``original`` preceded by making the file of its instance (or of ``owner(self)``), if it has none yet."""
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        target = owner(self)
        if getattr(target, _ATTR, None) is None and not probe.off:
            open_writer(probe, target)
        return original(self, *args, **kwargs)
    run.__name__ = getattr(original, "__name__", "run")
    return run


# ---- a worker rank -----------------------------------------------------------------------------------------------

def _worker_writer(probe: Probe, wrapper: Any) -> StepWriter | bool:
    world, _ = _parallel(getattr(wrapper, "vllm_config", None))
    local = int(getattr(wrapper, "rpc_rank", 0) or 0)
    rank = int(getattr(wrapper, "global_rank", local) or 0)
    w = probe.writer(layout.WORKER, rank, local_rank=local, world_size=world)
    setattr(wrapper, _ATTR, w)
    return w


def patch_worker(probe: Probe, module: Any) -> None:
    found = _target(probe, module, "WorkerWrapperBase", "execute_model")
    if found is None:
        return
    cls, execute = found

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        w = self._sparkd_probe
        if w is None:
            w = _worker_writer(probe, self)
        if w:
            try:
                w.begin(scheduler_output.total_num_scheduled_tokens)
            except Exception as exc:
                probe.fail(f"a worker step's beginning failed: {exc!r}")
                w = False
        try:
            return execute(self, scheduler_output, *args, **kwargs) if args or kwargs else execute(
                self, scheduler_output)
        finally:
            if w:
                try:
                    w.end()
                except Exception as exc:
                    probe.fail(f"a worker step's end failed: {exc!r}")

    probe.wrap(cls, "execute_model", lambda before: execute_model)


def patch_worker_proc(probe: Probe, module: Any) -> None:
    cls = getattr(module, "WorkerProc", None)
    if cls is not None and "worker_busy_loop" in cls.__dict__:  # else the first step makes the file
        probe.wrap(cls, "worker_busy_loop",
                   lambda before: _opening(before, _worker_writer, probe, owner=lambda self: self.worker))


PATCHES: dict[str, Callable[[Probe, Any], None]] = {
    "vllm.v1.engine.core": patch_engine,
    "vllm.v1.worker.worker_base": patch_worker,
    "vllm.v1.executor.multiproc_executor": patch_worker_proc,
}
