"""vLLM 0.32's shutdown with ``--shutdown-timeout N``, as the real-vLLM tier recorded it (tests/data/
vllm-drain-032.json and tests/data/vllm-logs/realvllm-032-drain*.log; tests/standin/test_standin_drain.py holds the
stand-in to them):

- SIGTERM reaches the API server: it logs ``stopping engine client mode=drain timeout=Ns`` (``mode=abort`` for 0)
  and keeps serving HTTP; ``/health`` stays 200 and ``/metrics`` answers until the process is gone. A new request
  is refused at once with HTTP 500 ``cannot schedule new futures after shutdown`` (vLLM's renderer has shut down
  its thread pool): a plain request and a stream alike.
- Its process manager sends the EngineCore SIGTERM and waits up to N s. The EngineCore logs the signal, ``start
  mode=drain timeout=Ns``, ``draining in-flight requests count=K timeout=Ns`` when K > 0, goes on serving those
  requests, and once none is left ``request processing complete; starting resource teardown``, then exits; every
  stream ends with all its tokens, its finish reason and ``[DONE]``.
- Past N s the process manager force-kills the EngineCore (``force killing remaining processes count=1``); with
  N = 0 that happens at once. Whenever the engine is gone with requests in it (killed so, or from outside during
  the drain), vLLM has cancelled its output handler: those streams get nothing more, ever.
- Then the API server stops the HTTP server: it exits 0 once every client connection has closed (never, while a
  stranded stream's client waits).

The API server's side is :func:`stop_engine` (in a thread, as vLLM runs it in an executor); the EngineCore's is
:func:`engine_shut_down`. The in-flight count is the API server's: it tells the engine with its drain message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sparkd_standin import logfmt
from sparkd_standin.dialect import Dialect

REFUSAL = {"error": {"message": "cannot schedule new futures after shutdown", "type": "InternalServerError",
                     "param": None, "code": 500}}
ABORT_LINES_S = 1.0  # with --shutdown-timeout 0 and nothing in flight: how long the engine still logs its abort
BUSY_STEP_S = 10.0  # with --shutdown-timeout 0 and requests in flight: the step the process manager's kill ends


class StopRequested(Exception):
    """The EngineCore's SIGTERM in 0.32: handled by its busy loop, which may drain first."""


def mode_of(timeout: int) -> str:
    return "abort" if timeout == 0 else "drain"


# ---- the API server


def stop_engine(d: Dialect, proc: Any, conn: Connection, timeout: int, in_flight: Callable[[], int],
                on_kill: Callable[[], None]) -> None:
    """The process manager's shutdown of the EngineCore: SIGTERM, then wait up to ``timeout`` s while the requests
    drain (telling the engine when none is left), then force-kill. Runs in a thread of the API server."""
    logfmt.info(d.at("mpclient_start"), f"[shutdown] MPClient: start timeout={timeout}s")
    logfmt.info(d.at("mpclient_stopping"), "[shutdown] MPClient: stopping engine manager")
    logfmt.info(d.at("send_sigterm"), f"[shutdown] Process manager: send sigterm to process {d.engine_proc}")
    with contextlib.suppress(OSError):
        conn.send(("drain", timeout, in_flight()))
    with contextlib.suppress(OSError):
        proc.terminate()
    busy_abort = timeout == 0 and in_flight() > 0
    if busy_abort:  # vLLM's join(0) and kill come before a busy engine gets to its shutdown (the recording)
        with contextlib.suppress(OSError):
            proc.kill()
    deadline, told = time.monotonic() + timeout, False
    while proc.is_alive() and time.monotonic() < deadline:
        if not told and in_flight() == 0:
            told = True
            with contextlib.suppress(OSError):
                conn.send(("drained",))
        proc.join(0.05)
    if proc.is_alive() or busy_abort:  # with 0 always: vLLM's join(0) finds the engine still there
        logfmt.warning(d.at("force_kill"), "[shutdown] Process manager: force killing remaining processes count=1")
        logfmt.warning(d.at("force_kill_proc"),
                       f"[shutdown] Process manager: force killing remaining process {d.engine_proc} pid {proc.pid}")
        if timeout == 0 and in_flight() == 0:
            proc.join(ABORT_LINES_S)  # an idle engine's own lines of the abort get out first (the recordings)
        with contextlib.suppress(OSError):
            proc.kill()
        proc.join(5)
    if in_flight() > 0:  # the engine is gone (killed here, or from outside) with requests in it: stranded
        on_kill()
    logfmt.info(d.at("mpclient_stopped"), "[shutdown] MPClient: engine manager stopped")
    logfmt.info(d.at("mpclient_cleanup"), "[shutdown] MPClient: cleaning up background resources")
    logfmt.info(d.at("mpclient_complete"), "[shutdown] MPClient: complete")


# ---- the EngineCore


def engine_shut_down(d: Dialect, conn: Connection, timeout: int, told: tuple[Any, ...] | None,
                     answer: Callable[[str], None]) -> None:
    """The EngineCore's busy loop after its SIGTERM, launched with ``--shutdown-timeout timeout``: the requests the
    API server counted in flight (``told``, or read now: it writes before it signals) are served (``answer``, their
    steps) until it says none is left. A SIGTERM from outside comes with no count: nothing to drain."""
    if told is None and conn.poll(0.2):
        with contextlib.suppress(EOFError, OSError):
            told = conn.recv()
    count = int(told[2]) if told and told[0] == "drain" else 0
    if timeout == 0 and count:
        # vLLM's busy loop is still in a step when the kill comes right after the SIGTERM: a busy engine never gets
        # to its own shutdown lines (the recording). Its stand-in is idle between steps: it waits for that kill
        # rather than race it (on a loaded machine it won the race and logged its abort).
        time.sleep(BUSY_STEP_S)
    logfmt.info(d.at("engine_start"), f"[shutdown] EngineCore: start mode={mode_of(timeout)} timeout={timeout}s")
    if timeout == 0 and count:
        logfmt.info(d.at("engine_aborting"), f"[shutdown] EngineCore: aborting in-flight requests count={count}")
    elif count:
        logfmt.info(d.at("engine_draining"),
                    f"[shutdown] EngineCore: draining in-flight requests count={count} timeout={timeout}s")
        _serve_until_drained(conn, answer)
    logfmt.info(d.at("engine_complete"),
                "[shutdown] EngineCore: request processing complete; starting resource teardown")
    logfmt.info(d.at("engine_exiting"), "[shutdown] EngineCore: exiting busy loop")


def _serve_until_drained(conn: Connection, answer: Callable[[str], None]) -> None:
    while True:
        try:
            kind, *params = conn.recv()
        except (EOFError, OSError):
            return  # the API server is gone (or killed us first)
        if kind == "drained":
            return
        if kind == "execute":
            answer(params[0])
