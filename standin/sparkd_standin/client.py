"""The API server's handle on its EngineCore: start it, wait for READY, run one step per request, notice death.

Death is noticed two ways: the engine's ENGINE_CORE_DEAD message, or its process ending while nobody asked it
to. Either logs "AsyncLLM output_handler failed." with the EngineDeadError traceback; 0.13 first logs "Engine
core proc EngineCore_DP0 died unexpectedly, shutting down client." for a process that ended (0.21+'s monitor is
silent). Either makes ``errored`` true: /health turns 503 and the watchdog stops the server.

Steps are serial, as in vLLM's engine: while one is in flight (a JIT compile, a hung collective) no request
produces a token (``steps_flow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from sparkd_standin import drain, logfmt
from sparkd_standin.args import ServeConfig
from sparkd_standin.engine import engine_core_main
from sparkd_standin.knobs import Knobs
from sparkd_standin.procs import Child, start_child

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_OUTPUT_HANDLER_LINES = {"0.13": (490, 893), "0.21": (660, 998), "0.24": (660, 998), "0.32": (849, 1235)}


def _output_handler_frames(family: str) -> list[tuple[str, int, str, str]]:
    handler, client = _OUTPUT_HANDLER_LINES[family]
    return [
        ("v1/engine/async_llm.py", handler, "output_handler", "outputs = await engine_core.get_output_async()"),
        ("v1/engine/core_client.py", client, "get_output_async", "raise self._format_exception(outputs) from None"),
    ]


class EngineDeadError(Exception):
    def __init__(self) -> None:
        super().__init__(ENGINE_DEAD_MESSAGE)


class EngineStartupError(Exception):
    """The EngineCore failed (or died) before READY; ``failed`` maps process names to exit codes."""

    def __init__(self, failed: dict[str, int | None]) -> None:
        super().__init__(f"Engine core initialization failed. See root cause above. Failed core proc(s): {failed}")


class EngineClient:
    def __init__(self, config: ServeConfig, knobs: Knobs) -> None:
        self.config = config
        self.knobs = knobs
        self.info: dict[str, Any] = {}
        self.dead = False
        self.shutting_down = False
        self.frozen = False  # the engine was killed while stopping: its requests get nothing more, ever
        self._child: Child | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        self._in_flight = 0
        self._no_step: asyncio.Event | None = None  # set while no step is in flight (made in the server's loop)

    @property
    def errored(self) -> bool:
        return self.dead

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child else None

    def start(self) -> None:
        self._child = start_child(engine_core_main, self.knobs.dialect.engine_proc, (self.config, self.knobs))

    def wait_ready(self) -> dict[str, Any]:
        """Block until READY. Raises EngineStartupError if the engine fails or dies first."""
        assert self._child is not None
        conn, proc = self._child.conn, self._child.proc
        wait([conn, proc.sentinel])
        message: tuple[Any, ...] = ("failed",)
        with contextlib.suppress(EOFError, OSError):
            if conn.poll():
                message = conn.recv()
        if message[0] != "ready":
            proc.join(10)
            raise EngineStartupError({self.knobs.dialect.engine_proc: proc.exitcode})
        self.info = message[1]
        threading.Thread(target=self._read_outputs, daemon=True, name="output_handler").start()
        threading.Thread(target=self._monitor, daemon=True, name="MPClientEngineMonitor").start()
        return self.info

    async def execute(self, request_id: str) -> None:
        """One engine step for the request; raises EngineDeadError if the engine is (or becomes) dead."""
        assert self._child is not None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self.dead:
                raise EngineDeadError
            self._pending[request_id] = (loop, future)
        self._step_started()
        try:
            with contextlib.suppress(OSError):  # a dead engine: the monitor fails the pending request
                self._child.conn.send(("execute", request_id))
            await future
        finally:
            self._step_ended()

    def _step_started(self) -> None:
        if self._no_step is None:
            self._no_step = asyncio.Event()
        self._in_flight += 1
        self._no_step.clear()

    def _step_ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._no_step is not None:
            self._no_step.set()

    async def steps_flow(self) -> None:
        """Returns once no engine step is in flight: tokens come only between steps."""
        if self._in_flight and self._no_step is not None:
            await self._no_step.wait()

    def stall(self) -> None:
        """From now on the engine never completes a step (a hung rank)."""
        assert self._child is not None
        with contextlib.suppress(OSError):
            self._child.conn.send(("stall",))

    def _read_outputs(self) -> None:
        assert self._child is not None
        while True:
            try:
                kind, *params = self._child.conn.recv()
            except (EOFError, OSError):
                return
            if kind == "result":
                self._resolve(params[0])
            elif kind == "dead":
                self._mark_dead(by_message=True)

    def _monitor(self) -> None:
        assert self._child is not None
        wait([self._child.proc.sentinel])
        self._mark_dead(by_message=False)

    def _mark_dead(self, *, by_message: bool) -> None:
        with self._lock:
            if self.dead or self.shutting_down:
                return
            self.dead = True
            pending, self._pending = self._pending, {}
        d = self.knobs.dialect
        if not by_message and d.logs_engine_proc_death:
            died = f"Engine core proc {d.engine_proc} died unexpectedly, shutting down client."
            logfmt.error(d.at("proc_died"), died)
        if not by_message and d.family == "0.32":
            logfmt.warning(d.at("engine_exited"),
                           "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
        text = logfmt.traceback_text(
            _output_handler_frames(d.family), f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}"
        )
        logfmt.exception(d.at("output_handler"), "AsyncLLM output_handler failed.", text)
        for loop, future in pending.values():
            loop.call_soon_threadsafe(_set_exception, future)

    def _resolve(self, request_id: str) -> None:
        with self._lock:
            entry = self._pending.pop(request_id, None)
        if entry is not None:
            loop, future = entry
            loop.call_soon_threadsafe(_set_result, future)

    def drain_stop(self, timeout: int, in_flight: Callable[[], int]) -> None:
        """0.32's process manager: SIGTERM the EngineCore, let it drain up to ``timeout`` s, force-kill it past
        that; requests left in a gone engine are stranded (``_killed``)."""
        with self._lock:
            self.shutting_down = True
        if self._child is None:
            return
        drain.stop_engine(self.knobs.dialect, self._child.proc, self._child.conn, timeout, in_flight,
                          on_kill=self._killed)
        self._child.close_pipes()

    def _killed(self) -> None:
        """vLLM 0.32 cancels its output handler as it stops the engine client, so the requests the killed engine
        held are never answered again: their streams hang until the client gives up (tests/data/
        vllm-drain-032.json, the abort and deadline scenarios)."""
        self.frozen = True

    def shutdown(self) -> None:
        """SIGTERM the EngineCore (it stops its workers), SIGKILL after 5 s."""
        with self._lock:
            self.shutting_down = True
        if self._child is not None:
            self._child.stop()


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(EngineDeadError())
