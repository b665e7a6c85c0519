"""Child processes: spawn context, the RPC pipe, the death pipe, signals and staged termination.

Every child gets a duplex RPC pipe and the read end of a death pipe whose write end only its parent holds. The
read end hits EOF when the parent dies, however it dies; ``watch_parent`` turns that into ``on_parent_exit``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext, SpawnContext, SpawnProcess
from typing import Any

TERMINATE_GRACE_S = 5.0  # vLLM: SIGTERM, wait 5 s (4 s for workers), then SIGKILL


def spawn_context() -> SpawnContext:
    return multiprocessing.get_context("spawn")


def lock_context() -> BaseContext:
    """The context of vLLM's ``shared_worker_lock``: under fork (its default) the semaphore is unlinked at once;
    under spawn (VLLM_WORKER_MULTIPROC_METHOD=spawn) it stays in /dev/shm as ``sem.mp-*`` while held."""
    method = "spawn" if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork") == "spawn" else "fork"
    return multiprocessing.get_context(method)


@dataclass
class Child:
    proc: SpawnProcess
    conn: Connection
    death_w: Connection

    def close_pipes(self) -> None:
        for conn in (self.conn, self.death_w):
            with contextlib.suppress(OSError):
                conn.close()

    def stop(self, grace_s: float = TERMINATE_GRACE_S, *, terminate_first: bool = True) -> None:
        """Close the pipes (the child sees its parent go), then SIGTERM, wait, SIGKILL.

        With ``terminate_first=False`` the child first gets ``grace_s`` to leave on its own (vLLM's workers).
        """
        self.close_pipes()
        if not terminate_first:
            self.proc.join(grace_s)
        for send in (self.proc.terminate, self.proc.kill):
            if not self.proc.is_alive():
                return
            with contextlib.suppress(OSError):
                send()
            self.proc.join(grace_s)


def start_child(target: Callable[..., Any], name: str, args: tuple[Any, ...]) -> Child:
    """Start ``target(*args, conn, death_r)`` in a spawned process named ``name``."""
    ctx = spawn_context()
    parent_conn, child_conn = ctx.Pipe()
    death_r, death_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, name=name, args=(*args, child_conn, death_r))
    proc.start()
    child_conn.close()
    death_r.close()
    return Child(proc, parent_conn, death_w)


def idle_threads(count: int) -> None:
    """Start ``count`` daemon threads that wait forever and cost no CPU: the thread pools a real vLLM process holds."""
    forever = threading.Event()
    for index in range(max(0, count)):
        threading.Thread(target=forever.wait, name=f"standin-idle-{index}", daemon=True).start()


def watch_parent(death_r: Connection, on_parent_exit: Callable[[], None]) -> None:
    def run() -> None:
        with contextlib.suppress(EOFError, OSError):
            death_r.recv()
        on_parent_exit()

    threading.Thread(target=run, daemon=True, name="DeathPipeMonitor").start()


def exit_on_signals(announce: Callable[[str], None] | None = None, raising: type[Exception] | None = None) -> None:
    """SIGTERM/SIGINT raise SystemExit once, as vLLM's engine, worker and headless handlers do; ``announce`` is told
    the signal's name first (0.32's engine core logs it); ``raising``: raise this instead, for the busy loop to
    shut down in order (0.32's engine core drains)."""
    requested = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if _HOLD.on:
            _HOLD.deferred.append(signum)
            return
        if not requested.is_set():
            requested.set()
            if announce is not None:
                announce(signal.Signals(signum).name)
            if raising is not None:
                raise raising
            raise SystemExit

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


class _Hold:
    def __init__(self) -> None:
        self.on = False
        self.deferred: list[int] = []


_HOLD = _Hold()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defers :func:`exit_on_signals`' handler to the end of the block: raised inside a pipe's ``recv``, it would
    lose the message half read (the engine's drain count, its SIGTERM's closest neighbour)."""
    _HOLD.on = True
    try:
        yield
    finally:
        _HOLD.on = False
        if _HOLD.deferred:
            signal.raise_signal(_HOLD.deferred.pop())


def ignore_sigterm() -> None:
    """Models a main thread stuck in C code while loading: SIGTERM has no effect."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
