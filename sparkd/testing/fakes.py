"""The world a test's daemon loop runs against, in memory: :class:`FakeRuntime` (instances the script makes print,
become ready, crash or ignore SIGTERM; every launch and stop recorded), :class:`FakeProbes`, :class:`FakeAnswers`
(the acceptance gate's answers), :class:`FakeNotifier` and scripted preflight checks."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import psutil

from sparkd.acceptance.client import AskFailed
from sparkd.config import Config
from sparkd.host.waits import Flag
from sparkd.launch.render import LaunchSpec
from sparkd.preflight.base import Check, CheckResult, PreflightContext, Verdict
from sparkd.runtime.base import ExecResult, ExitInfo, Instance, LaunchError, Runtime, TargetUnavailable
from sparkd.state.schema import PID_MAX
from sparkd.supervisor.acceptance.answers import Answer as GateAnswer
from sparkd.supervisor.acceptance.answers import Shape
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.health import ProbeOutcome, ProbeResult, VllmMetrics
from sparkd.supervisor.healthsignal import Answer


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


# Near the top of what a record may hold (state.schema.PID_MAX), past most hosts' pid_max, and any pid a host's
# process holds is skipped: whatever looks a fake pid up (the watch's pidfd, psutil) finds nothing. At 4000, a CI
# host's own process of that pid held the watch's exit thread open, and the fake clock waited for that thread at
# every step.
FAKE_PID_BASE = PID_MAX - 100_000


class FakeRuntime(Runtime):
    """vLLM as the script says. ``auto_ready``: an instance serves as soon as it is launched."""

    name = "fake"

    def __init__(self, *, auto_ready: bool = True) -> None:
        self.auto_ready = auto_ready
        self.procs: dict[int, _Proc] = {}
        self.launches: list[LaunchSpec] = []
        self.stops: list[tuple[int, float]] = []  # (pid, grace_s) of every stop asked for
        self.launch_error: LaunchError | None = None
        self._pids = itertools.count(FAKE_PID_BASE)

    @property
    def current(self) -> _Proc | None:
        alive = [p for p in self.procs.values() if p.exit is None]
        return alive[-1] if alive else None

    def start(self, *, serving: bool = True) -> Instance:
        """An instance that runs already (for adoption): returns it, to be written as the record."""
        pid = next(p for p in self._pids if not psutil.pid_exists(p))
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

    async def follow_logs(self, instance: Instance, done: Flag) -> AsyncIterator[str]:
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
