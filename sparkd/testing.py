"""Fakes for running sparkd's real daemon loop in-process, in milliseconds (honcho's way).

- :class:`FakeClock`: monotonic and wall time that move only when told, or jump to the next sleeper once every
  task is blocked (:meth:`FakeClock.run_until`), so a 300 s backoff passes in microseconds. "Every task is
  blocked" is the event loop's own word, as trio's autojump clock hears it from trio's run loop: the loop of
  :func:`new_event_loop` says so when it would wait for I/O or a timer with nothing ready to run. Run the tests on
  it (``anyio_backend = ("asyncio", {"loop_factory": new_event_loop})``, as tests/conftest.py does).
- :class:`FakeRuntime`: instances that live in memory; the script makes them print lines, become ready,
  crash or ignore SIGTERM; it records every launch and stop (with its grace).
- :class:`FakeProbes`: /health answers 200 once the instance is serving, refused before.
- :class:`FakeAnswers`: the acceptance gate's answers from the serving instance, as a healthy, a changed or a
  garbling engine gives them.
- :class:`FakeNotifier`: the systemd notifications, recorded.
- :func:`passing_check` / :func:`failing_check`: preflight checks with a scripted verdict.

``tests/unit/test_daemon_loop.py`` shows a scripted history end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import selectors
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from sparkd.acceptance.client import AskFailed
from sparkd.config import Config
from sparkd.launch.render import LaunchSpec
from sparkd.preflight.base import Check, CheckResult, PreflightContext, Verdict
from sparkd.runtime.base import ExecResult, ExitInfo, Instance, LaunchError, Runtime, TargetUnavailable
from sparkd.supervisor.acceptance.answers import Answer as GateAnswer
from sparkd.supervisor.acceptance.answers import Shape
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.health import ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.healthsignal import Answer

IDLE_LIMIT_S = 30.0  # real seconds run_until waits with nothing asleep on the fake clock (a worker thread's file
# write takes milliseconds)
THREAD_WAIT_S = 2.0  # real seconds run_until holds the fake clock for a worker thread before it moves time anyway
# (a thread that waits for the fake clock itself must not stop it)

_in_threads = 0  # anyio worker threads running now (the daemon's file writes, its golden, its hashing)
_real_run_sync = anyio.to_thread.run_sync


async def _counted_run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    global _in_threads
    _in_threads += 1
    try:
        return await _real_run_sync(func, *args, **kwargs)
    finally:
        _in_threads -= 1


def _count_threads() -> None:
    """A task waiting for a worker thread is blocked in the event loop's eyes, yet the thread's work takes real
    time: counted, ``run_until`` holds the fake clock while one runs, so that a loaded machine's slow thread does
    not see fake hours pass (a gate's budget spent while its golden was being written)."""
    anyio.to_thread.run_sync = _counted_run_sync  # type: ignore[assignment]

__all__ = ["FakeAnswers", "FakeClock", "FakeNotifier", "FakeProbes", "FakeRuntime", "all_tasks_blocked",
           "failing_check", "new_event_loop", "passing_check"]


class FakeClock:
    def __init__(self, start: float = 1000.0, wall_offset: float = 1_800_000_000.0) -> None:
        self.t = start
        self.wall_offset = wall_offset
        _count_threads()
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + self.wall_offset

    async def sleep(self, seconds: float) -> None:
        wake = anyio.Event()
        heapq.heappush(self._sleepers, (self.t + max(0.0, seconds), next(self._order), wake))
        await wake.wait()

    def advance(self, seconds: float) -> None:
        """Move time on and wake every sleeper whose time has come."""
        self.t += seconds
        while self._sleepers and self._sleepers[0][0] <= self.t:
            heapq.heappop(self._sleepers)[2].set()

    async def run_until(self, done: Callable[[], bool], *, limit_s: float = 86_400.0) -> float:
        """Let every task run; whenever all are blocked and ``done()`` is false, jump to the next sleeper.
        Returns the fake seconds that passed. Raises TimeoutError past ``limit_s`` of fake time, or when nothing
        sleeps on the clock for ``IDLE_LIMIT_S`` real seconds (nothing left that could make ``done()`` true)."""
        started = self.t
        idle_since: float | None = None
        threads_since: float | None = None
        while True:
            await all_tasks_blocked()
            if done():
                return self.t - started
            if _in_threads:
                threads_since = time.monotonic() if threads_since is None else threads_since
                if time.monotonic() - threads_since < THREAD_WAIT_S:
                    await anyio.sleep(0.001)
                    continue
            threads_since = None
            if not self._sleepers:
                idle_since = time.monotonic() if idle_since is None else idle_since
                if time.monotonic() - idle_since > IDLE_LIMIT_S:
                    raise TimeoutError(f"not done, and nothing has slept on the fake clock for {IDLE_LIMIT_S:.0f} s")
                await anyio.sleep(0.001)  # a worker thread (a file write) may still be busy
                continue
            idle_since = None
            if self._sleepers[0][0] - started > limit_s:
                raise TimeoutError(f"not done after {limit_s:.0f} fake seconds")
            self.advance(max(0.0, self._sleepers[0][0] - self.t))


class _IdleSelector(selectors.DefaultSelector):
    """The loop's selector, which also tells who asked when the loop is idle: asked to wait (for I/O, a timer or
    for ever) while nothing is ready, because every task awaits something that has not happened yet."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[asyncio.Future[None]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if not self.waiting or timeout == 0:  # work is ready: the loop runs it before it waits
            return super().select(timeout)
        ready = super().select(0)
        if ready:  # I/O came in (a socket, a worker thread's result): not idle yet
            return ready
        waiting, self.waiting = self.waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)  # its task is ready now: the loop runs it next, without waiting
        return []


class _IdleLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.idle = _IdleSelector()
        super().__init__(self.idle)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop that says when every task is blocked (:func:`all_tasks_blocked`); otherwise the stock
    selector loop."""
    return _IdleLoop()


async def all_tasks_blocked() -> None:
    """Return once every other task waits on something: the loop of :func:`new_event_loop` had nothing ready."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, _IdleLoop):
        raise RuntimeError("all_tasks_blocked needs the loop of sparkd.testing.new_event_loop: run the test with "
                           "anyio_backend = ('asyncio', {'loop_factory': sparkd.testing.new_event_loop})")
    future: asyncio.Future[None] = loop.create_future()
    loop.idle.waiting.append(future)
    await future


@dataclass
class _Proc:
    instance: Instance
    lines: list[str] = field(default_factory=list)
    serving: bool = False
    exit: ExitInfo | None = None
    ignores_sigterm: bool = False
    drains: bool = False  # SIGTERM starts a drain: it ends when the script says (``finish``) or on SIGKILL
    ended: anyio.Event = field(default_factory=anyio.Event)
    more: anyio.Event = field(default_factory=anyio.Event)


class FakeRuntime(Runtime):
    """vLLM as the script says. ``auto_ready``: an instance serves as soon as it is launched."""

    name = "fake"

    def __init__(self, *, auto_ready: bool = True) -> None:
        self.auto_ready = auto_ready
        self.procs: dict[int, _Proc] = {}
        self.launches: list[LaunchSpec] = []
        self.stops: list[tuple[int, float]] = []  # (pid, grace_s) of every stop asked for
        self.launch_error: LaunchError | None = None
        self._pids = itertools.count(4000)

    @property
    def current(self) -> _Proc | None:
        alive = [p for p in self.procs.values() if p.exit is None]
        return alive[-1] if alive else None

    def start(self, *, serving: bool = True) -> Instance:
        """An instance that runs already (for adoption): returns it, to be written as the record."""
        pid = next(self._pids)
        instance = Instance(runtime=self.name, pid=pid, create_time=float(pid), config_hash="fake")
        self.procs[pid] = _Proc(instance, serving=serving)
        return instance

    async def launch(self, spec: LaunchSpec) -> Instance:
        if self.launch_error is not None:
            raise self.launch_error
        self.launches.append(spec)
        instance = self.start(serving=self.auto_ready)
        return Instance(**{**instance.to_record(), "config_hash": spec.config_hash})

    async def find(self, record: dict[str, Any] | None) -> Instance | None:
        if not record or record.get("runtime") != self.name:
            return None
        proc = self.procs.get(int(record.get("pid", 0)))
        return Instance.from_record(record) if proc is not None and proc.exit is None else None

    async def wait(self, instance: Instance) -> ExitInfo:
        proc = self.procs[instance.pid]
        await proc.ended.wait()
        assert proc.exit is not None
        return proc.exit

    async def stop(self, instance: Instance, grace_s: float) -> ExitInfo:
        self.stops.append((instance.pid, grace_s))
        proc = self.procs[instance.pid]
        if proc.exit is None and proc.drains:  # a drain: the script ends it, or the kill (a grace of 0) does
            if grace_s > 0:
                await proc.ended.wait()
                assert proc.exit is not None
                return proc.exit
            self.end(instance.pid, ExitInfo(exit_code=None, signal=9))
            return replace(proc.exit or ExitInfo(exit_code=None), killed=(instance.pid,))
        if proc.exit is None:
            self.end(instance.pid, ExitInfo(exit_code=None, signal=9 if proc.ignores_sigterm else 15))
            if proc.ignores_sigterm:
                return replace(proc.exit or ExitInfo(exit_code=None), killed=(instance.pid,))
        return proc.exit or ExitInfo(exit_code=None)

    async def follow_logs(self, instance: Instance, done: anyio.Event) -> AsyncIterator[str]:
        proc = self.procs[instance.pid]
        sent = 0
        while True:
            while sent < len(proc.lines):
                sent += 1
                yield proc.lines[sent - 1]
            if proc.exit is not None:
                return
            proc.more = anyio.Event()
            await proc.more.wait()

    def proven(self, record: dict[str, Any], expected: Any) -> bool:
        """Its instances are its own: a record naming one of them is proof enough."""
        return int(record.get("pid") or 0) in self.procs

    def pids(self, instance: Instance) -> set[int]:
        proc = self.procs.get(instance.pid)
        return {instance.pid} if proc is not None and proc.exit is None else set()

    # ---- where vLLM runs: nowhere a command could run
    @classmethod
    def from_config(cls, cfg: Config, *, rehearse: bool = False) -> FakeRuntime:
        return cls()

    where = "in the fake runtime"
    shares_host_network = False
    shares_host_ipc = False

    async def exec(self, cmd: Any, *, env: Any = None, timeout_s: float = 0.0) -> ExecResult:
        raise TargetUnavailable("the fake runtime runs no commands")

    async def missing_target(self, spec: LaunchSpec) -> str | None:
        return None

    # ---- the script
    def say(self, *lines: str) -> None:
        proc = self.current
        assert proc is not None, "no instance runs"
        proc.lines.extend(lines)
        proc.more.set()

    def finish(self, exit_code: int = 0) -> None:
        """The current instance's drain is over: it exits on its own."""
        proc = self.current
        assert proc is not None, "no instance runs"
        self.end(proc.instance.pid, ExitInfo(exit_code=exit_code))

    def serve(self) -> None:
        assert self.current is not None
        self.current.serving = True

    def crash(self, exit_code: int | None = 1, signal: int | None = None) -> int:
        proc = self.current
        assert proc is not None, "no instance runs"
        self.end(proc.instance.pid, ExitInfo(exit_code=exit_code, signal=signal))
        return proc.instance.pid

    def end(self, pid: int, info: ExitInfo) -> None:
        proc = self.procs[pid]
        proc.exit = info
        proc.serving = False
        proc.ended.set()
        proc.more.set()


class FakeProbes:
    """The probes of the runtime's current instance: 200 while it serves, refused otherwise; ``pages``: what
    ``fetch`` answers for a path (404 for any other)."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime
        self.metrics_value: VllmMetrics | None = None
        self.pages: dict[str, str] = {}

    async def health(self) -> ProbeResult:
        proc = self.runtime.current
        if proc is not None and proc.serving:
            return ProbeResult(ProbeOutcome.ok, 0.001, "HTTP 200")
        return ProbeResult(ProbeOutcome.refused, 0.001, "connection refused")

    async def metrics(self) -> VllmMetrics | None:
        return self.metrics_value

    async def canary(self) -> ProbeResult:
        return await self.health()

    async def fetch(self, path: str) -> Answer | ProbeResult:
        served = await self.health()
        if served.outcome is not ProbeOutcome.ok:
            return served
        return Answer(200, self.pages[path], 0.001) if path in self.pages else Answer(404, "Not Found", 0.001)

    async def aclose(self) -> None:
        pass


WORDS = tuple(f" {w}" for w in ("river", "stone", "light", "city", "garden", "seven", "quiet", "window", "paper",
                                  "north", "music", "bridge", "summer", "answer", "number", "green"))


class FakeAnswers:
    """The acceptance gate's answers from the runtime's current instance (refused while it does not serve): each
    prompt its own words every time (``mode`` "normal"), other words ("changed": new weights), broken characters
    ("garble"); ``hang``: no answer at all. It is its own factory (``Adapters(answers=FakeAnswers(runtime))``);
    ``asked`` counts the questions."""

    def __init__(self, runtime: FakeRuntime, mode: str = "normal") -> None:
        self.runtime, self.mode = runtime, mode
        self.asked = 0
        self.hang = False

    def __call__(self, cfg: Config) -> FakeAnswers:
        return self

    async def ask(self, prompt_name: str, prompt: str, api: str, shape: Shape,
                  chat_template_kwargs: Any = None) -> GateAnswer:
        proc = self.runtime.current
        if proc is None or not proc.serving:
            raise AskFailed(f"prompt {prompt_name!r} ({api}): connection refused")
        if self.hang:
            await anyio.sleep_forever()
        self.asked += 1
        seed = hashlib.sha256(f"{'changed:' if self.mode == 'changed' else ''}{prompt}".encode()).digest()
        ids = tuple(100 + seed[i % len(seed)] % len(WORDS) for i in range(min(shape.max_tokens, 24)))
        tokens = tuple(" \ufffd\ufffd" if self.mode == "garble" else WORDS[i - 100] for i in ids)
        top = tuple(((t, -0.05), (" other", -3.0)) for t in tokens)
        return GateAnswer(prompt_name, api, ids, "".join(tokens), "length", tokens, top)

    async def metrics(self) -> str | None:
        return None

    async def awake(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


class FakeNotifier:
    """sd_notify, recorded: ``sent`` holds every datagram's lines."""

    def __init__(self, watchdog_s: float | None = None) -> None:
        self.sent: list[tuple[str, ...]] = []
        self.watchdog_s = watchdog_s
        self.pets: list[float] = []  # the loop's last progress each pet was given

    def ready(self, status: str) -> None:
        self.sent.append(("READY=1", f"STATUS={status}"))

    def status(self, status: str) -> None:
        self.sent.append((f"STATUS={status}",))

    def stopping(self) -> None:
        self.sent.append(("STOPPING=1",))

    @property
    def watchdog_interval_s(self) -> float | None:
        return None if self.watchdog_s is None else self.watchdog_s / 2

    def pet(self, last_progress: float, now: float | None = None) -> bool:
        self.pets.append(last_progress)
        return self.watchdog_s is not None and now is not None and now - last_progress <= self.watchdog_s / 2


def passing_check(check_id: str = "scripted") -> Check:
    async def run(ctx: PreflightContext) -> CheckResult:
        return CheckResult(Verdict.ok, "all good")

    return Check(check_id, run)


def failing_check(found: str, cls: FailureClass = FailureClass.unknown, check_id: str = "scripted") -> Check:
    async def run(ctx: PreflightContext) -> CheckResult:
        return CheckResult(Verdict.fail, found, failure_class=cls)

    return Check(check_id, run)
