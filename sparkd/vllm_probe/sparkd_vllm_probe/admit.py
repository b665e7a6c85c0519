"""The drain takes in what vLLM had already accepted: ``SPARKD_DRAIN_ADMIT=1`` (sparkd's launch sets it when it
renders a drain, ``--shutdown-timeout`` above 0).

vLLM 0.32's API server sends a stream's headers (HTTP 200) as it hands the request to the engine core, which takes
its input between two steps. A SIGTERM during a step makes the engine core, at its next turn, start the drain and
then reject every request still in its input queue (``EngineCore._reject_add_in_shutdown``): those clients get
their 200 and an empty stream (``[DONE]``, no token, no finish reason, no error), and vLLM logs nothing at INFO.
Measured on the real vLLM 0.32 with its worker held inside a step: two streams answered 200 before the SIGTERM, one
drained with its 480 tokens, the other ended empty 1.15 s later (the drain counted 1). Every request in that queue
was sent before the API server stopped taking requests (after its SIGTERM it refuses a newcomer at once, HTTP 500),
so it is one the drain owes an answer.

The wrap: when the engine core turns to a shutdown that drains, it first takes in the new requests already in its
input queue, as it would have before the signal (an abort or a utility call there is handled as vLLM handles it in a
shutdown), then goes on as vLLM does (the drain counts them; what comes later is rejected as before). Nothing
changes while vLLM serves, nor for ``--shutdown-timeout 0`` (an abort). Any failure of this code puts vLLM's method
back with one warning; vLLM's own exceptions pass through.
"""

from __future__ import annotations

import logging
import queue
from typing import Any

log = logging.getLogger("vllm.sparkd_probe")

ADMIT_ENV = "SPARKD_DRAIN_ADMIT"


def patch_admit(module: Any) -> None:
    """Wrap ``EngineCoreProc._handle_shutdown`` of ``vllm.v1.engine.core`` (vLLM 0.32's drain, vllm#34730)."""
    cls = getattr(module, "EngineCoreProc", None)
    original = getattr(cls, "_handle_shutdown", None)
    states = getattr(module, "EngineShutdownState", None)
    request_types = getattr(module, "EngineCoreRequestType", None)
    if cls is None or original is None or states is None or request_types is None:
        log.warning("sparkd drain: this vLLM has no EngineCoreProc._handle_shutdown: a request the engine had not "
                    "taken in at a SIGTERM is dropped, as vLLM does")
        return
    requested, running, add = states.REQUESTED, states.RUNNING, request_types.ADD

    def _handle_shutdown(self: Any) -> Any:
        if self.shutdown_state == requested and _drains(self):
            try:
                admitted = _admit(self, running, add)
            except _OwnFailure as exc:
                cls._handle_shutdown = original
                log.warning("sparkd drain: turned off (%r); vLLM drains as it does", exc.__cause__)
            else:
                if admitted:
                    log.info("sparkd drain: took in %d request(s) accepted before the SIGTERM", admitted)
        return original(self)

    cls._handle_shutdown = _handle_shutdown


class _OwnFailure(Exception):
    """A failure of this module's code, not of vLLM's."""


def _drains(engine: Any) -> bool:
    try:
        return float(engine.vllm_config.shutdown_timeout or 0) > 0
    except Exception:
        return False


def _admit(engine: Any, running: Any, add: Any) -> int:
    """Every request in the input queue handled in order: a new one as while serving, anything else (an abort, a
    utility call, a wakeup) as vLLM handles it in a shutdown. How many new requests were taken in."""
    try:
        state, inbox = engine.shutdown_state, engine.input_queue
    except Exception as exc:
        raise _OwnFailure from exc
    admitted = 0
    while True:
        try:
            kind, request = inbox.get_nowait()
        except queue.Empty:
            return admitted
        if kind != add:
            engine._handle_client_request(kind, request)
            continue
        engine.shutdown_state = running  # a SIGTERM meanwhile sets REQUESTED again: the same as what is put back
        try:
            engine._handle_client_request(kind, request)
        finally:
            engine.shutdown_state = state
        admitted += 1
