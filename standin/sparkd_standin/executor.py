"""Executors, as in vLLM: the multiproc executor spawns one worker process per local rank and drives them with
RPCs; the uni executor (one rank on one node) runs the rank inside the EngineCore. Both offer
``start / wait_ready / collective / sentinels / shutdown``.

The multiproc executor's RPCs can carry an ``RpcWait``: while the workers do not answer it logs vLLM's
shared-memory broadcast warning every VLLM_RINGBUFFER_WARNING_INTERVAL, and it gives up with
``RPC call to sample_tokens timed out.`` after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (both scaled by the
``time_scale`` knob). The uni executor calls the rank in-process, with no queue and no timeout: a step that
hangs there hangs the engine, as in vLLM.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from sparkd_standin.args import ServeConfig
from sparkd_standin.knobs import Knobs, scaled
from sparkd_standin.procs import Child, start_child
from sparkd_standin.worker import WorkerError, WorkerRuntime, WorkerSpec, worker_main

WORKER_GRACE_S = 4.0  # vLLM's _ensure_worker_termination: SIGTERM, 4 s, SIGKILL


class WorkerInitFailed(Exception):
    """A worker reported FAILED (or died) before READY."""


class WorkerDied(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class RpcTimeout(Exception):
    """The workers did not answer an RPC within its timeout."""


class RpcWait:
    """How long the EngineCore waits for its workers, warning while it does (vLLM's ``MessageQueue.dequeue``)."""

    def __init__(self, knobs: Knobs, on_warn: Callable[[int], None]) -> None:
        self.shown_interval = int(float(os.environ.get("VLLM_RINGBUFFER_WARNING_INTERVAL", "60")))
        self.warn_every_s = scaled(self.shown_interval, knobs)
        self.timeout_s = scaled(float(os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300")), knobs)
        self.on_warn = on_warn
        self.started = time.monotonic()
        self.next_warn = self.started + self.warn_every_s

    def remaining(self) -> float:
        return max(0.0, min(self.next_warn, self.started + self.timeout_s) - time.monotonic())

    def tick(self) -> None:
        """Called when a wait ran out: warn, or raise RpcTimeout past the deadline."""
        now = time.monotonic()
        if now >= self.started + self.timeout_s:
            raise RpcTimeout
        if now >= self.next_warn:
            self.on_warn(self.shown_interval)
            self.next_warn += self.warn_every_s


class RpcFailed(Exception):
    """A worker's RPC raised; ``message`` is the worker's exception message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def init_method(config: ServeConfig, knobs: Knobs | None = None) -> str:
    if config.nnodes > 1:
        return f"tcp://{config.master_addr}:{config.master_port}"
    if knobs is not None and knobs.dialect.cpu_build:  # vLLM's CPU build: gloo over a file store
        return f"file:///tmp/vllm_dist_{os.urandom(16).hex()}"
    with socket.socket() as sock:  # vLLM: get_loopback_ip() + get_open_port()
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def local_specs(
    config: ServeConfig, knobs: Knobs, node_rank: int, method: str, parent_title: str | None = None
) -> list[WorkerSpec]:
    per_node = config.local_world_size
    first = node_rank * per_node
    return [
        WorkerSpec(config, knobs, first + local, local, method, parent_title=parent_title) for local in range(per_node)
    ]


class MultiprocExecutor:
    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.specs = specs
        self.children: list[Child] = []
        self.shutting_down = False

    def start(self) -> None:
        for spec in self.specs:
            self.children.append(start_child(worker_main, spec.proc_name, (spec,)))

    def wait_ready(self) -> None:
        for child in self.children:
            try:
                status, _ = self._reply(child)
            except WorkerDied as exc:
                raise WorkerInitFailed from exc
            if status != "ready":
                raise WorkerInitFailed

    def collective(self, kind: str, *params: Any, wait_for: RpcWait | None = None) -> list[Any]:
        """Send one RPC to every worker and gather the results; the first failure is raised."""
        for child in self.children:
            try:
                child.conn.send((kind, *params))
            except OSError as exc:
                raise WorkerDied(child.proc.name) from exc
        results, failure = [], None
        for child in self.children:
            status, value = self._reply(child, wait_for)
            if status == "error" and failure is None:
                failure = RpcFailed(value)
            results.append(value)
        if failure is not None:
            raise failure
        return results

    def _reply(self, child: Child, wait_for: RpcWait | None = None) -> tuple[str, Any]:
        while not wait([child.conn, child.proc.sentinel], None if wait_for is None else wait_for.remaining()):
            assert wait_for is not None
            wait_for.tick()
        try:
            if child.conn.poll():
                return child.conn.recv()
        except (EOFError, OSError):
            pass
        raise WorkerDied(child.proc.name)

    def sentinels(self) -> list[int]:
        return [child.proc.sentinel for child in self.children]

    def name_of(self, sentinel: int) -> str:
        return next(child.proc.name for child in self.children if child.proc.sentinel == sentinel)

    def pids(self) -> list[int]:
        return [child.proc.pid for child in self.children if child.proc.pid is not None]

    def shutdown(self) -> None:
        self.shutting_down = True
        for child in self.children:
            child.close_pipes()
        for child in self.children:
            child.stop(WORKER_GRACE_S, terminate_first=False)


class UniExecutor:
    """The single rank runs in this process; its failures surface as the EngineCore's own."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.runtime = WorkerRuntime(spec)
        self.shutting_down = False

    def start(self) -> None:
        pass

    def wait_ready(self) -> None:
        self.runtime.init_device()
        self.runtime.load()

    def collective(self, kind: str, *params: Any, wait_for: RpcWait | None = None) -> list[Any]:
        try:
            return [getattr(self.runtime, kind)(*params)]
        except WorkerError as exc:
            raise RpcFailed(exc.message) from exc

    def sentinels(self) -> list[int]:
        return []

    def name_of(self, sentinel: int) -> str:
        raise KeyError(sentinel)

    def pids(self) -> list[int]:
        return []

    def shutdown(self) -> None:
        self.shutting_down = True
        self.runtime.close()


Executor = MultiprocExecutor | UniExecutor


def make_executor(config: ServeConfig, knobs: Knobs, node_rank: int, parent_title: str | None = None) -> Executor:
    specs = local_specs(config, knobs, node_rank, init_method(config, knobs), parent_title)
    if config.world_size == 1 and config.nnodes == 1 and not config.headless and not knobs.dialect.cpu_build:
        return UniExecutor(WorkerSpec(config, knobs, 0, 0, specs[0].init_method, in_process=True))
    return MultiprocExecutor(specs)
