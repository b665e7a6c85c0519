"""Faults injected after ready, on the head's API server: die, hang, stall (the worker leaks by itself), at
the knobs' times or when the control file asks (:mod:`sparkd_standin.control`).

- die/exit: stop the children, exit with die_exit_code.  die/kill: SIGKILL this process.
- die/engine: SIGKILL the EngineCore (engine-death path).  die/worker: SIGKILL the local worker (executor
  failure → engine death); with a single in-process rank there is no worker process, so the engine dies.
- hang: the event loop blocks: connections are accepted by the kernel, nothing is answered. A signal still
  ends the block so that SIGTERM keeps working.
- stall: from now on no engine step completes (a wedged rank); /health stays 200 and the gauges keep the last
  completed step's values. With workers in their own processes the EngineCore warns that no shared-memory
  broadcast block is free and turns fatal ("RPC call to sample_tokens timed out") after
  VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (default 300, times ``time_scale``), as vLLM does; with one in-process
  rank (uni executor) it hangs for good, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import Protocol

from sparkd_standin.api import AppState
from sparkd_standin.control import POLL_S, Command, ControlFile


class _Exitable(Protocol):
    should_exit: bool
    force_exit: bool


def die(state: AppState) -> None:
    knobs, engine = state.knobs, state.engine
    if knobs.die_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if knobs.die_mode == "exit":
        engine.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(knobs.die_exit_code)
    worker_pids = engine.info.get("worker_pids") or []
    victim = worker_pids[0] if knobs.die_mode == "worker" and worker_pids else engine.pid
    if victim:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def block_event_loop(server: _Exitable) -> None:
    """Hold the event loop until a signal asks the server to exit (uvicorn's handler sets should_exit)."""
    while not (server.should_exit or server.force_exit):
        time.sleep(0.1)


async def run_faults(state: AppState, server: _Exitable) -> None:
    knobs = state.knobs
    plan = sorted(
        (after, kind)
        for after, kind in ((knobs.die_after, "die"), (knobs.hang_after, "hang"), (knobs.stall_after, "stall"))
        if after is not None
    )
    started = time.monotonic()
    for after, kind in plan:
        await asyncio.sleep(max(0.0, started + after - time.monotonic()))
        if kind == "die":
            die(state)
        elif kind == "hang":
            block_event_loop(server)
        else:
            stall(state)


def stall(state: AppState) -> None:
    state.source.stalled = True
    state.engine.stall()


async def follow_control(control: ControlFile, state: AppState, server: _Exitable) -> None:
    """Take the control file's stall, hang and answer commands (a worker takes leak); silently, as a wedge is."""
    while True:
        await asyncio.sleep(POLL_S)
        command: Command | None = control.poll()
        if command is None:
            continue
        if command.fault == "stall":
            stall(state)
        elif command.fault == "hang":
            block_event_loop(server)
        else:
            answer_as(state, command)
        control.done(command)


def answer_as(state: AppState, command: Command) -> None:
    """What the engine answers from now on: its text, its speculative decoder, NaNs in its logits."""
    if command.fault == "answers":
        state.source.answers = command.value
    elif command.fault == "spec":
        state.metrics.spec_accepting = command.value == "on"
    elif command.fault == "nans":
        state.metrics.nan_logits = command.value == "on"
