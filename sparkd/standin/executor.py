"""Executors, as in vLLM: the multiproc executor spawns one worker process per local rank and drives them with
RPCs; the uni executor (one rank on one node) runs the rank inside the EngineCore. Both offer
``start / wait_ready / collective / sentinels / shutdown``.
"""

from __future__ import annotations

import socket
from multiprocessing.connection import wait
from typing import Any

from sparkd.standin.args import ServeConfig
from sparkd.standin.knobs import Knobs
from sparkd.standin.procs import Child, start_child
from sparkd.standin.worker import WorkerError, WorkerRuntime, WorkerSpec, worker_main

WORKER_GRACE_S = 4.0  # vLLM's _ensure_worker_termination: SIGTERM, 4 s, SIGKILL


class WorkerInitFailed(Exception):
    """A worker reported FAILED (or died) before READY."""


class WorkerDied(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class RpcFailed(Exception):
    """A worker's RPC raised; ``message`` is the worker's exception message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def init_method(config: ServeConfig) -> str:
    if config.nnodes > 1:
        return f"tcp://{config.master_addr}:{config.master_port}"
    with socket.socket() as sock:  # vLLM: get_loopback_ip() + get_open_port()
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def local_specs(config: ServeConfig, knobs: Knobs, node_rank: int, method: str) -> list[WorkerSpec]:
    per_node = config.local_world_size
    first = node_rank * per_node
    return [WorkerSpec(config, knobs, first + local, local, method) for local in range(per_node)]


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

    def collective(self, kind: str, *params: Any) -> list[Any]:
        """Send one RPC to every worker and gather the results; the first failure is raised."""
        for child in self.children:
            try:
                child.conn.send((kind, *params))
            except OSError as exc:
                raise WorkerDied(child.proc.name) from exc
        results, failure = [], None
        for child in self.children:
            status, value = self._reply(child)
            if status == "error" and failure is None:
                failure = RpcFailed(value)
            results.append(value)
        if failure is not None:
            raise failure
        return results

    def _reply(self, child: Child) -> tuple[str, Any]:
        wait([child.conn, child.proc.sentinel])
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

    def collective(self, kind: str, *params: Any) -> list[Any]:
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


def make_executor(config: ServeConfig, knobs: Knobs, node_rank: int) -> Executor:
    specs = local_specs(config, knobs, node_rank, init_method(config))
    if config.world_size == 1 and config.nnodes == 1 and not config.headless:
        return UniExecutor(WorkerSpec(config, knobs, 0, 0, specs[0].init_method, in_process=True))
    return MultiprocExecutor(specs)
