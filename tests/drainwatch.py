"""Watch a vLLM (the real one or the stand-in) drain: streaming clients in flight, a SIGTERM, and what every client,
``/health`` and ``/metrics`` see until the process is gone.

One harness for the recording of the real vLLM 0.32 (tests/realvllm/record_drain.py writes
tests/data/vllm-drain-032.json), the stand-in's comparison with that recording (tests/standin/test_standin_drain.py)
and the real-vLLM tier's drain scenarios, so the three measure the same things the same way. Clients speak plain
HTTP to loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import psutil

_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\}\s+([0-9.eE+-]+)", re.M)
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\}\s+([0-9.eE+-]+)", re.M)


@dataclass
class Stream:
    """One streaming completion as its client saw it."""

    max_tokens: int
    status: int | None = None
    chunks: list[float] = field(default_factory=list)  # monotonic time of every text chunk
    finish_reason: str | None = None
    completion_tokens: int | None = None  # the tokens so far (vLLM's usage on every chunk); at the end, the total
    done: bool = False  # the `data: [DONE]` line arrived
    error: str | None = None  # what broke the stream, if something did
    ended_at: float | None = None

    def summary(self, since: float) -> dict[str, Any]:
        """What the recording keeps: counts and outcomes, times relative to ``since`` (the SIGTERM)."""
        return {"max_tokens": self.max_tokens, "status": self.status, "chunks": len(self.chunks),
                "chunks_after_sigterm": sum(1 for t in self.chunks if t >= since),
                "finish_reason": self.finish_reason, "completion_tokens": self.completion_tokens,
                "done": self.done, "error": self.error,
                "ended_after_sigterm_s": None if self.ended_at is None else round(self.ended_at - since, 2)}

    @property
    def complete(self) -> bool:
        """Every token asked for, a normal finish and the stream's end marker."""
        return self.done and self.finish_reason == "length" and self.completion_tokens == self.max_tokens


MAX_QUANTUM_S = 0.16  # Throttle.step_until's longest quantum, in wall time (the tiny model makes ~80 tokens in it
# at full speed; a quantum ends sooner, at a clock tick of the worker's CPU)


@contextlib.contextmanager
def on_time() -> Iterator[None]:
    """The calling thread at real-time priority (SCHED_FIFO) meanwhile: it stops other processes after a sleep, and
    on a loaded host a thread of normal priority woke from a 5 ms sleep only after the worker it held had run three
    streams through (CI-like run 2026-12-07 01:14). Where the kernel refuses (no CAP_SYS_NICE), as before."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


class Throttle:
    """Slows processes of our own by stopping and continuing them (SIGSTOP/SIGCONT): they run ``share`` of every
    ``period_s``. The tiny test model generates its 480 tokens in under a second, faster than the API server
    streams them, so an engine left at full speed has nothing in flight by the time a SIGTERM comes; throttled
    (its worker: the forward passes), its requests are still running, as a large model's are for minutes."""

    def __init__(self, procs: list[psutil.Process], share: float = 0.1, period_s: float = 0.1) -> None:
        self.procs, self.share, self.period_s = procs, share, period_s  # bound when seen: a reused PID is never hit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="throttle")

    def start(self) -> Throttle:
        self._thread.start()
        return self

    def _signal(self, sig: int) -> None:
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.share > 0:  # at 0 they stay stopped: a SIGCONT at once undone still lets them run a while
                    self._signal(signal.SIGCONT)
                    time.sleep(self.period_s * self.share)
                self._signal(signal.SIGSTOP)
                self._stop.wait(self.period_s * (1 - self.share))
        finally:
            self._signal(signal.SIGCONT)

    def hold(self) -> None:
        """Stop them now, and keep them stopped until ``share`` is set again."""
        self.share = 0.0
        self._signal(signal.SIGSTOP)

    def step_until(self, done: Callable[[], bool], cpu_s: float = 0.01, settle_s: float = 0.5,
                   timeout_s: float = 120.0) -> int:
        """Held processes run in quanta of ``cpu_s`` of their own CPU (a clock tick; at most :data:`MAX_QUANTUM_S`
        of wall time), each followed by up to ``settle_s`` stopped, until ``done()``; how many quanta it took. What a
        client sees lags what the engine did (the API server paces the streams), so it is asked while the worker
        stands still. Beside the whole suite (CI-like run 2026-12-07 01:14) the worker ran three streams' 480 tokens
        through, three times, before their first chunks were out: quanta of wall time, doubled after one without CPU,
        ended when this thread woke, which a loaded host delays. Now their CPU bounds the engine's steps, and this
        thread wakes on time (:func:`on_time`)."""
        with on_time():
            return self._step_until(done, cpu_s, settle_s, timeout_s)

    def _step_until(self, done: Callable[[], bool], cpu_s: float, settle_s: float, timeout_s: float) -> int:
        self.hold()
        deadline = time.monotonic() + timeout_s
        quanta = 0
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"not done after {quanta} quanta")
            ran, began = self._cpu_s(), time.monotonic()
            self._signal(signal.SIGCONT)
            while self._cpu_s() - ran < cpu_s and time.monotonic() - began < MAX_QUANTUM_S:
                time.sleep(0.001)
            self._signal(signal.SIGSTOP)
            quanta += 1
            settled = time.monotonic() + settle_s
            while time.monotonic() < settled and not done():
                time.sleep(0.01)
        return quanta

    def _cpu_s(self) -> float:
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def stopped(self) -> bool:
        """Every held process is stopped now (a SIGSTOP delivered, not only sent)."""
        try:
            return all(proc.status() == psutil.STATUS_STOPPED for proc in self.procs)
        except psutil.Error:
            return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._signal(signal.SIGCONT)


def completion_body(model: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": "tell me a long story", "max_tokens": max_tokens,
                            "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        # usage on every chunk: the tokens the engine has made so far, once the API server has streamed them
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def run_stream(base: str, model: str, out: Stream, timeout_s: float = 600.0) -> None:
    """Send one streaming completion and fill ``out`` as its chunks arrive (run in a thread)."""
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client, client.stream(
                "POST", f"{base}/v1/completions", json=completion_body(model, out.max_tokens, stream=True)) as reply:
            out.status = reply.status_code
            for line in reply.iter_lines():
                _take(out, line)
    except (httpx.HTTPError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        out.ended_at = time.monotonic()


def _take(out: Stream, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data.strip() == "[DONE]":
        out.done = True
        return
    try:
        chunk = json.loads(data)
    except ValueError:
        out.error = f"not JSON: {data[:120]}"
        return
    if "error" in chunk:
        out.error = json.dumps(chunk["error"])[:200]
    for choice in chunk.get("choices") or []:
        if choice.get("text"):
            out.chunks.append(time.monotonic())
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        out.completion_tokens = usage.get("completion_tokens")


def one_request(base: str, model: str, *, stream: bool, timeout_s: float = 30.0,
                client: httpx.Client | None = None) -> dict[str, Any]:
    """One new request (a short completion): its status, the start of its body and how long the answer took;
    through ``client`` (closed after) where given, else a client of its own."""
    began = time.monotonic()
    answer: dict[str, Any] = {"stream": stream}
    try:
        with client or httpx.Client(timeout=timeout_s) as used:
            reply = used.post(f"{base}/v1/completions", json=completion_body(model, 8, stream=stream))
            answer.update(status=reply.status_code, body=reply.text[:400])
    except (httpx.HTTPError, OSError) as exc:
        answer.update(status=None, error=f"{type(exc).__name__}")
    answer["seconds"] = round(time.monotonic() - began, 2)
    return answer


def newcomers(base: str, model: str, clients: list[httpx.Client]) -> list[dict[str, Any]]:
    """A new plain request and a new stream, sent at once side by side (each through one of ``clients``, made
    ahead: building an httpx client costs a loaded machine seconds), answers in that order."""
    answers: list[dict[str, Any]] = [{}, {}]

    def send(index: int) -> None:
        answers[index] = one_request(base, model, stream=index == 1, client=clients[index])

    threads = [threading.Thread(target=send, args=(i,), daemon=True, name=f"newcomer-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def metrics_counts(page: str) -> tuple[float | None, float | None]:
    """(running, waiting) from a /metrics page, None where the family is absent."""
    running, waiting = _RUNNING.search(page), _WAITING.search(page)
    return (float(running.group(1)) if running else None, float(waiting.group(1)) if waiting else None)


class Poller:
    """``/health`` and ``/metrics`` every ``interval_s``, each answer kept with its time."""

    def __init__(self, base: str, interval_s: float = 0.25) -> None:
        self.base, self.interval_s = base, interval_s
        self.health: list[tuple[float, str]] = []  # (time, "200" | "503" | the error's name)
        self.metrics: list[tuple[float, float | None, float | None]] = []  # (time, running, waiting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="drain-poller")

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                now = time.monotonic()
                self.health.append((now, _status(lambda: client.get(f"{self.base}/health?probe=sparkd"))))
                with contextlib.suppress(httpx.HTTPError, OSError):
                    page = client.get(f"{self.base}/metrics?probe=sparkd")
                    if page.status_code == 200:
                        self.metrics.append((now, *metrics_counts(page.text)))
                self._stop.wait(self.interval_s)


def _status(call: Callable[[], httpx.Response]) -> str:
    try:
        return str(call().status_code)
    except (httpx.HTTPError, OSError) as exc:
        return type(exc).__name__


def runs(values: list[tuple[float, str]], since: float) -> list[str]:
    """The distinct answers after ``since``, in order, repeats folded: ``["200", "ConnectError"]``."""
    out: list[str] = []
    for at, value in values:
        if at >= since and (not out or out[-1] != value):
            out.append(value)
    return out


@dataclass
class DrainRun:
    """Streams started, the signal sent, the clients and pollers watched until the process ended."""

    base: str
    model: str
    streams: list[Stream]
    poller: Poller
    sigterm_at: float = 0.0
    during: list[dict[str, Any]] = field(default_factory=list)  # new requests sent during the drain
    exited_after_s: float | None = None
    exit_code: int | None = None

    def summary(self) -> dict[str, Any]:
        since = self.sigterm_at
        running = [r for at, r, _ in self.poller.metrics if at >= since and r is not None]
        each = [s.summary(since) for s in self.streams]
        ends = [e["ended_after_sigterm_s"] for e in each if e["ended_after_sigterm_s"] is not None]
        return {"streams": len(each), "complete": sum(1 for s in self.streams if s.complete),
                "ended": sum(1 for s in self.streams if s.ended_at is not None),
                "finish_reasons": _tally(e["finish_reason"] for e in each),
                "done_markers": sum(1 for e in each if e["done"]),
                "errors": _tally(e["error"] for e in each if e["error"]),
                "statuses": _tally(e["status"] for e in each),
                "least_chunks_after_sigterm": min((e["chunks_after_sigterm"] for e in each), default=0),
                "last_stream_ended_after_sigterm_s": max(ends, default=None),
                "example": each[0] if each else None, "during": self.during,
                "metrics_before_sigterm": [(round(at - since, 2), r, w) for at, r, w in self.poller.metrics
                                           if at < since][-8:],
                "health_after_sigterm": runs(self.poller.health, since),
                "metrics_running_after_sigterm": _folded(running),
                "exited_after_sigterm_s": self.exited_after_s, "exit_code": self.exit_code}


def _tally(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return out


def _folded(values: list[float]) -> list[float]:
    out: list[float] = []
    for value in values:
        if not out or out[-1] != value:
            out.append(value)
    return out


def wait_answered(streams: list[Stream], settle_s: float = 1.0, timeout_s: float = 120.0) -> None:
    """Until every stream has its answer's status, then ``settle_s`` more: the API server sends the status as it
    starts the stream, and hands the request to the engine core a moment later."""
    deadline = time.monotonic() + timeout_s
    while not all(s.status is not None or s.ended_at for s in streams):
        if time.monotonic() > deadline:
            raise AssertionError("the streams were not answered")
        time.sleep(0.01)
    time.sleep(settle_s)


def wait_quiet(streams: list[Stream], quiet_s: float = 1.5, timeout_s: float = 60.0) -> None:
    """Until no stream has had a chunk for ``quiet_s``: with the engine's worker stopped, the API server has then
    streamed every token the engine made, and each stream's ``completion_tokens`` is the engine's count."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = max((s.chunks[-1] for s in streams if s.chunks), default=0.0)
        if time.monotonic() - last >= quiet_s:
            return
        time.sleep(0.05)
    raise AssertionError("the streams never went quiet")


def wait_begun(streams: list[Stream], settle_s: float = 0.3, timeout_s: float = 120.0, *,
               every: bool = False) -> None:
    """Until every stream has its answer's status and one has its first chunk (``every``: each has its first
    chunk), then ``settle_s`` more. vLLM's gauges cannot tell: on its CPU build they read 0 while streams run.

    A status is not proof that the request is in vLLM's engine: the API server sends a stream's headers while the
    request is still on its way to the engine core, which vLLM 0.32 aborts once a SIGTERM came
    (``EngineCore._reject_add_in_shutdown``). Beside the suite, with the worker throttled (each engine step 50 times
    as long), two of four streams answered 200 were still outside it 0.3 s after the first stream's first chunk: the
    engine drained `count=2` (CI-like run 2026-12-08 02:13). Only a stream's first token proves it in the engine."""
    deadline = time.monotonic() + timeout_s
    begun = all if every else any
    while not (all(s.status is not None or s.ended_at for s in streams) and begun(s.chunks for s in streams)):
        if time.monotonic() > deadline:
            raise AssertionError("the streams did not begin")
        time.sleep(0.01)
    time.sleep(settle_s)


def start_streams(base: str, model: str, n: int, max_tokens: int) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream(max_tokens) for _ in range(n)]
    threads = [threading.Thread(target=run_stream, args=(base, model, s), daemon=True, name=f"stream-{i}")
               for i, s in enumerate(streams)]
    for thread in threads:
        thread.start()
    return streams, threads


def drain(base: str, model: str, *, signal_it: Callable[[], None], wait_exit: Callable[[float], int | None],
          n: int = 3, max_tokens: int = 256, during_after_s: float = 1.0,
          newcomers_when: Callable[[], None] | None = None,
          exit_timeout_s: float = 180.0, after_signal: Callable[[], None] | None = None,
          streams_done: Callable[[], None] | None = None) -> DrainRun:
    """``n`` streams of ``max_tokens`` each; once they run (:func:`wait_begun`), ``signal_it`` (a SIGTERM);
    then a new plain and a new streaming request (:func:`newcomers`): once ``newcomers_when`` returns (it waits for
    the process's own word that it is in the phase wanted: on a loaded machine a fixed delay lands anywhere), else
    ``during_after_s`` later; ``after_signal`` (e.g. cut the drain short) right after those; then every stream's
    end, ``streams_done`` (e.g. end a throttle, so the teardown runs at full speed) and ``wait_exit`` (the
    process's exit status, None if unknown)."""
    poller = Poller(base, interval_s=0.1).start()
    streams, threads = start_streams(base, model, n, max_tokens)
    wait_begun(streams)
    clients = [httpx.Client(timeout=30.0) for _ in range(2)]
    run = DrainRun(base, model, streams, poller, sigterm_at=time.monotonic())
    signal_it()
    if newcomers_when is None:
        time.sleep(during_after_s)
    else:
        newcomers_when()
    run.during.extend(newcomers(base, model, clients))
    if after_signal is not None:
        after_signal()
    ends = time.monotonic() + exit_timeout_s
    for thread in threads:
        thread.join(max(0.0, ends - time.monotonic()))
    if streams_done is not None:
        streams_done()
    run.exit_code = wait_exit(exit_timeout_s)
    run.exited_after_s = round(time.monotonic() - run.sigterm_at, 2)
    poller.stop()
    return run


def as_json(value: Any) -> Any:
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value
