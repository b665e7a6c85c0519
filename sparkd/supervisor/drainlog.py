"""A drain as vLLM shows it: the requests still in flight and the time left, from its log lines and gauges. Pure.

vLLM (0.24+; 0.32's words below, the real vLLM tier's recording in tests/data/vllm-logs/realvllm-032-drain.log)
logs its shutdown step by step once SIGTERM reaches its API server::

    (APIServer pid=7) INFO ... [launcher.py:270] [shutdown] API server: stopping engine client mode=drain timeout=60s
    (EngineCore pid=9) INFO ... [core.py:1635] [shutdown] EngineCore: start mode=drain timeout=60s
    (EngineCore pid=9) INFO ... [core.py:1649] [shutdown] EngineCore: draining in-flight requests count=3 timeout=60s
    (EngineCore pid=9) INFO ... [core.py:1666] [shutdown] EngineCore: request processing complete; starting ...
    (APIServer pid=7) WARNING ... [utils.py:648] [shutdown] Process manager: force killing remaining processes ...

Rules:

- The drain begins at sparkd's SIGTERM (:func:`begin`, with the drain it was launched with) or, read from the log,
  at the first shutdown-start line, whichever comes first; vLLM's own ``timeout`` replaces the launch's.
- ``mode=abort`` (``--shutdown-timeout 0``) is no drain: the requests are aborted at once.
- The count in flight is vLLM's start count, then every later reading of its gauges (``vllm:num_requests_running``
  plus ``waiting``) or of its throughput line (``Running: N reqs, Waiting: M reqs``), never more than it was: a
  request refused during the drain is counted by no gauge.
- ``request processing complete`` ends the drain (nothing left in flight); a force kill before it means vLLM gave
  up at its deadline (in drain mode) and killed its engine with the requests still running.
- Once the engine is gone with requests in it (aborted, given up, or killed from outside), vLLM 0.32 answers their
  streams nothing more, ever: its HTTP server logs uvicorn's ``Waiting for connections to close`` and waits for
  clients that wait for it (measured: tests/data/vllm-drain-032.json, the abort, deadline and cut scenarios). That
  is ``stranded``: only ending the API server ends those connections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum

from sparkd.supervisor.logline import clean
from sparkd.supervisor.servelog import Throughput, read_serve_line

__all__ = ["Drain", "DrainState", "advance", "begin", "counted", "is_drain_line"]

_START = re.compile(r"\[shutdown\] (?:API server: stopping engine client|EngineCore: start) "
                    r"mode=(?P<mode>drain|abort) timeout=(?P<timeout>\d{1,9})s")
_DRAINING = re.compile(r"\[shutdown\] EngineCore: draining in-flight requests count=(?P<n>\d{1,9})")
_ABORTING = re.compile(r"\[shutdown\] EngineCore: aborting in-flight requests count=(?P<n>\d{1,9})")
_COMPLETE = re.compile(r"\[shutdown\] EngineCore: request processing complete")
_FORCE_KILL = re.compile(r"\[shutdown\] Process manager: force killing remaining processes")
_STRANDED = re.compile(r"Waiting for connections to close")  # uvicorn's, as the HTTP server stops


class DrainState(StrEnum):
    draining = "draining"  # requests may still be in flight, the deadline not passed
    drained = "drained"  # vLLM finished every request in flight: its teardown follows
    aborted = "aborted"  # vLLM aborted the requests (no drain: --shutdown-timeout 0)
    gave_up = "gave_up"  # the deadline passed with requests in flight: vLLM killed its engine
    stranded = "stranded"  # the engine is gone, its clients' connections open: nothing will ever answer them


@dataclass(frozen=True)
class Drain:
    started_at: float  # monotonic: sparkd's SIGTERM, or the first shutdown line read
    timeout_s: float  # how long vLLM drains: its own logged timeout once read, else the launch's
    mode: str = "drain"  # vLLM's word: "drain", or "abort" when it drains nothing
    in_flight_at_start: int | None = None
    in_flight: int | None = None  # the last count known
    ended_at: float | None = None  # when the state left `draining`
    state: DrainState = DrainState.draining

    @property
    def requests_done(self) -> bool:
        """The engine finished its requests or gave them up: on a group's head, the worker ranks may be stopped now
        without turning a request into an NCCL error (none is left running on them)."""
        return self.state is not DrainState.draining

    def left_s(self, now: float) -> float:
        """Seconds to vLLM's deadline (0 once it has passed or the drain is over)."""
        if self.state is not DrainState.draining:
            return 0.0
        return max(0.0, self.started_at + self.timeout_s - now)

    def sentence(self, now: float) -> str:
        """``draining: 3 in flight, 97 s left``; ``drained in 12.3 s``; ``aborted 3 requests``; ``gave up ...``."""
        if self.state is DrainState.draining:
            count = "the count in flight not read yet" if self.in_flight is None else f"{self.in_flight} in flight"
            return f"draining: {count}, {self.left_s(now):.0f} s left"
        took = f"{(self.ended_at or now) - self.started_at:.1f} s"
        if self.state is DrainState.drained:
            return f"drained in {took}"
        if self.state is DrainState.aborted:
            n = self.in_flight_at_start
            return "aborted the requests in flight" if n is None else f"aborted {n} request{'s' * (n != 1)}"
        if self.state is DrainState.stranded:
            n = self.in_flight or self.in_flight_at_start
            whose = f"the clients of {n} request{'s' * (n != 1)}" if n else "its clients"
            return f"stranded after {took}: the engine is gone and {whose} still wait"
        left = "requests" if self.in_flight is None else f"{self.in_flight} request{'s' * (self.in_flight != 1)}"
        return f"gave up after {took} with {left} in flight (the {self.timeout_s:g} s drain ran out)"

    def to_json(self, now: float) -> dict[str, object]:
        return {"state": self.state.value, "mode": self.mode, "in_flight": self.in_flight,
                "in_flight_at_start": self.in_flight_at_start, "timeout_s": self.timeout_s,
                "left_s": round(self.left_s(now), 1), "sentence": self.sentence(now)}


def is_drain_line(line: str) -> bool:
    """Does :func:`advance` read this raw line (a step of vLLM's shutdown it follows)?"""
    text = clean(line)
    return bool(_STRANDED.search(text)) or ("[shutdown]" in text and any(
        p.search(text) for p in (_START, _DRAINING, _ABORTING, _COMPLETE, _FORCE_KILL)))


def begin(now: float, timeout_s: float) -> Drain:
    """sparkd sent SIGTERM to a vLLM launched with ``--shutdown-timeout timeout_s``."""
    if timeout_s <= 0:
        return Drain(now, 0.0, mode="abort")
    return Drain(now, float(timeout_s))


def advance(drain: Drain | None, line: str, now: float) -> Drain | None:
    """Fold one raw log line into ``drain`` (None: no drain seen yet); the same object when it changes nothing."""
    text = clean(line)
    if drain is not None and drain.state is not DrainState.drained and _STRANDED.search(text):
        return drain if drain.state is DrainState.stranded else replace(drain, state=DrainState.stranded,
                                                                         ended_at=drain.ended_at or now)
    if "[shutdown]" not in text:
        serve = read_serve_line(line)
        return counted(drain, serve.running, serve.waiting) if isinstance(serve, Throughput) and drain else drain
    if (m := _START.search(text)) is not None:
        timeout = float(m.group("timeout"))
        if drain is None:
            return Drain(now, timeout, mode=m.group("mode"))
        if (drain.timeout_s, drain.mode) == (timeout, m.group("mode")):
            return drain
        return replace(drain, timeout_s=timeout, mode=m.group("mode"))
    if drain is None:
        return drain
    if (m := _ABORTING.search(text)) is not None:  # the engine's count may come after the API server's kill
        return replace(drain, in_flight_at_start=int(m.group("n")), in_flight=0, state=DrainState.aborted,
                       ended_at=drain.ended_at or now)
    if drain.state is not DrainState.draining:
        return drain
    if (m := _DRAINING.search(text)) is not None:
        n = int(m.group("n"))
        return replace(drain, in_flight_at_start=n, in_flight=n)
    if _COMPLETE.search(text):
        if drain.mode == "abort":
            return replace(drain, in_flight=0, state=DrainState.aborted, ended_at=now)
        return replace(drain, in_flight=0, state=DrainState.drained, ended_at=now)
    if _FORCE_KILL.search(text):
        if drain.mode == "abort":
            return replace(drain, in_flight=0, state=DrainState.aborted, ended_at=now)
        return replace(drain, state=DrainState.gave_up, ended_at=now)
    return drain


def counted(drain: Drain | None, running: float | None, waiting: float | None) -> Drain | None:
    """A reading of vLLM's gauges during the drain: the requests left (never more than before)."""
    if drain is None or drain.state is not DrainState.draining or running is None:
        return drain
    n = int(running) + int(waiting or 0)
    if drain.in_flight is not None:
        n = min(n, drain.in_flight)
    return drain if n == drain.in_flight else replace(drain, in_flight=n)
