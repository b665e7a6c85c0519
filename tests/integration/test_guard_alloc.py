"""The guard against real memory: a child leaks real, resident memory toward a floor set just under this
machine's MemAvailable, and the in-process Guard (real /proc, real kernel log, real signals) stops or kills
it, writes the incident folder first, and the failure reaches the supervisor as ``killed_by_guard``.

Safety: the floor is computed from MemAvailable at the start (``stop = available - 1.5 GiB``), every child
is capped at 6 GiB and stops on its own once MemAvailable is under 6.5 GiB, and a test is skipped unless
MemAvailable stays above 6 GiB even with the whole cap allocated. The cap is well past the kill floor, so other
work on the host that frees memory during a test (MemAvailable rising by a GiB or two) does not let a child
stop short of the floors. Children are ended by PID in teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from freeport import free_port

from sparkd.config import GuardConfig
from sparkd.guard import Guard
from sparkd.guard.meminfo import MeminfoReader
from sparkd.guard.policy import Decision
from sparkd.guard.sample import GIB
from sparkd.runtime import proctree
from sparkd.state.incidents import incident_record, write_incident
from sparkd.supervisor import lifecycle, policy
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import Machine, State

MIB = 1024**2
SAFE_AVAILABLE = 6 * GIB  # never let a test take the machine under this
STOP_DISTANCE = int(1.5 * GIB)  # the stop floor sits this far under MemAvailable at the start
KILL_DISTANCE = int(2.25 * GIB)
CAP_MB = 6144  # no child allocates more than this

# A leak of real, resident memory at a steady rate (MADV_POPULATE_WRITE, or touching each page).
ALLOCATOR = r"""
import mmap, signal, sys, time
rate, cap, ignore_term = float(sys.argv[1]) * 2**20, int(sys.argv[2]) * 2**20, sys.argv[3] == "1"
floor = int(sys.argv[4])

def available():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))

if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
chunks, total, start = [], 0, time.monotonic()
print("leaking", flush=True)
while total < cap and available() > floor:
    target = min(cap, int(rate * (time.monotonic() - start)))
    while total < target:
        n = min(64 * 2**20, target - total)
        m = mmap.mmap(-1, n)
        try:
            m.madvise(23)  # MADV_POPULATE_WRITE
        except OSError:
            memoryview(m)[::4096] = b"\1" * len(range(0, n, 4096))
        chunks.append(m)
        total += n
    time.sleep(0.01)
print("capped", flush=True)
time.sleep(20)
"""


def available() -> int:
    with MeminfoReader() as reader:
        return reader.read().mem_available


def guard_config(start_available: int, **overrides: Any) -> GuardConfig:
    stop = start_available - STOP_DISTANCE
    return GuardConfig(**{
        "stop_below": stop, "kill_below": start_available - KILL_DISTANCE, "warn_below": stop + GIB // 2,
        "refuse_start_below": stop, "recover_margin": 256 * MIB, "debounce_samples": 3, "cooldown_s": 5.0,
        "stop_grace_s": 10.0, **overrides,
    })


@pytest.fixture
def start_available() -> int:
    now = available()
    if now - CAP_MB * MIB - GIB // 2 < SAFE_AVAILABLE:
        pytest.skip(f"MemAvailable {now / GIB:.1f} GiB: too little to leak {CAP_MB} MiB and keep 6 GiB spare")
    return now


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:  # ours, by PID: whatever the test left running
        for pid in sorted(proctree.tree_pids(proc.pid), reverse=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        proc.wait(timeout=30)


@dataclass
class Hooks:
    """The daemon's side: the child is the vLLM tree; evidence is a real incident folder."""

    root_pid: int
    incidents: Path
    stop_grace_used: list[float] = field(default_factory=list)
    evidence: list[tuple[float, bool, Path]] = field(default_factory=list)  # (when, tree alive, folder)
    reported: list[tuple[str, Failure]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    def vllm_pids(self) -> set[int]:
        return proctree.tree_pids(self.root_pid)

    def starting(self) -> bool:
        return False

    def idle(self) -> bool | None:
        return None

    def on_decision(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def write_evidence(self, failure: Failure, evidence: dict[str, Any]) -> None:
        alive = proctree.running(psutil.Process(self.root_pid))
        record = incident_record(failure, at=time.time(), config_hash="test", node="test")
        folder = write_incident(self.incidents, record, log_tail=["(guard test)"],
                                evidence=failure.treatment.evidence)
        self.evidence.append((time.monotonic(), alive, folder))

    async def stop_vllm(self, failure: Failure, grace_s: float) -> None:
        self.stop_grace_used.append(grace_s)
        self.reported.append(("stop", failure))
        await proctree.terminate_tree(self.root_pid, grace_s)

    async def kill_vllm(self, failure: Failure) -> None:
        self.reported.append(("kill", failure))

    async def planned_restart(self, reason: str) -> None:
        raise AssertionError("no planned restart expected")


def spawn_allocator(children: list[subprocess.Popen[bytes]], rate_mb_s: float, *, ignore_term: bool = False,
                    ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", ALLOCATOR, str(rate_mb_s), str(CAP_MB), "1" if ignore_term else "0",
                             str(SAFE_AVAILABLE + GIB // 2)],
                            stdout=subprocess.PIPE)
    children.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == b"leaking\n"
    return proc


async def guard_until_exit(guard: Guard, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """Run the guard until the child exits (pidfd: cancellable, unlike a thread blocked in wait())."""
    with anyio.fail_after(timeout_s):
        async with anyio.create_task_group() as tg:
            await tg.start(guard.run)
            await proctree.wait_exit(proc.pid)
            tg.cancel_scope.cancel()
    assert guard.signals, ("the child left on its own before the guard acted (did other work on this host free "
                         "memory and move MemAvailable past the floor during the test?)")
    return proc.wait()


def assert_supervisor_reports_guard(failure: Failure) -> None:
    """The pure supervisor takes the guard's failure as is, records it, and weighs it double."""
    m = Machine(state=State.ready, since=0.0)
    m, actions, _ = lifecycle.step(m, v.HealthFailed(failure, grace_s=10.0, recorded=True), 10.0)
    assert m.state is State.stopping and m.answering is failure
    assert actions == [v.RecordIncident(failure, written=True), v.Stop("health failed", 10.0, failure)]
    m, _, _ = lifecycle.step(m, v.StopDone(rand=0.5), 11.0)
    assert m.state is State.backoff and m.last_failure is not None
    assert m.last_failure.cls is FailureClass.killed_by_guard
    assert policy.window_weight(m.restart_state, policy.RestartPolicy(), 11.0) == 2


def min_available(guard: Guard) -> int:
    return min(s.available for s in guard.recent)


@pytest.mark.anyio
async def test_guard_stops_a_real_leak(tmp_path: Path, start_available: int,
                                       children: list[subprocess.Popen[bytes]]) -> None:
    """500 MiB/s of real memory: SIGTERM after the evidence, the child is gone, the class is killed_by_guard."""
    cfg = guard_config(start_available)
    proc = spawn_allocator(children, 500)
    hooks = Hooks(proc.pid, tmp_path / "incidents")
    guard = Guard(lambda: cfg, hooks)
    code = await guard_until_exit(guard, proc)

    assert code == -signal.SIGTERM
    assert [k.signal for k in guard.signals] == [signal.SIGTERM]
    (when, alive, folder), = hooks.evidence
    assert alive and when <= guard.signals[0].at
    assert (folder / "incident.json").read_text().count('"killed_by_guard"') == 1
    assert (folder / "meminfo.txt").exists()
    (kind, failure), = hooks.reported
    assert kind == "stop" and failure.cls is FailureClass.killed_by_guard and hooks.stop_grace_used == [10.0]
    assert failure.evidence is not None and "under the stop floor" in failure.evidence
    assert min_available(guard) > SAFE_AVAILABLE
    assert_supervisor_reports_guard(failure)


@pytest.mark.anyio
async def test_guard_kills_a_leak_that_ignores_sigterm(tmp_path: Path, start_available: int,
                                                       children: list[subprocess.Popen[bytes]]) -> None:
    """A child deaf to SIGTERM (vLLM while loading) keeps leaking through the grace: at the kill floor the
    guard SIGKILLs it by pidfd, without a second incident."""
    cfg = guard_config(start_available, stop_grace_s=60.0)
    proc = spawn_allocator(children, 500, ignore_term=True)
    hooks = Hooks(proc.pid, tmp_path / "incidents")
    guard = Guard(lambda: cfg, hooks)
    code = await guard_until_exit(guard, proc)

    assert code == -signal.SIGKILL
    assert [k.signal for k in guard.signals] == [signal.SIGTERM, signal.SIGKILL]
    assert guard.signals[1].pids == (proc.pid,)
    assert len(hooks.evidence) == 1 and hooks.evidence[0][1]
    assert [kind for kind, _ in hooks.reported] == ["stop", "kill"]
    assert all(f.cls is FailureClass.killed_by_guard for _, f in hooks.reported)
    assert hooks.reported[1][1].signal == signal.SIGKILL
    assert min_available(guard) > SAFE_AVAILABLE


@pytest.mark.anyio
async def test_guard_stops_the_leaking_standin(tmp_path: Path, start_available: int,
                                               children: list[subprocess.Popen[bytes]]) -> None:
    """The vLLM stand-in with its worker leaking 500 MB/s: the guard stops the whole tree gracefully, and the
    supervisor's classifier, given the guard's hint and the stand-in's own log, says killed_by_guard."""
    port = free_port()
    # Own title prefix: stale-process sweeps that other tests run on this host look for VLLM::* only.
    env = {"SPARKD_STANDIN_LEAK_MB_PER_S": "500", "SPARKD_STANDIN_LEAK_MAX_MB": str(CAP_MB),
           "SPARKD_STANDIN_STARTUP_SECONDS": "0.5", "PYTHONUNBUFFERED": "1",
           "VLLM_PROCESS_NAME_PREFIX": "GUARDTEST"}
    log = tmp_path / "standin.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkd_standin", "serve", "/models/test", "--host", "127.0.0.1",
             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env={**_base_env(), **env})
    children.append(proc)
    hooks = Hooks(proc.pid, tmp_path / "incidents")
    cfg = guard_config(start_available)
    guard = Guard(lambda: cfg, hooks)
    code = await guard_until_exit(guard, proc, timeout_s=90.0)

    assert [k.signal for k in guard.signals][:1] == [signal.SIGTERM]
    assert guard.signals[0].pids == (proc.pid,)  # the API server, the tree's root: it stops its engine and workers
    assert hooks.evidence[0][1] and hooks.evidence[0][0] <= guard.signals[0].at
    (kind, failure), *_ = hooks.reported
    assert kind == "stop" and failure.cls is FailureClass.killed_by_guard
    tail = log.read_text(errors="replace").splitlines()[-300:]
    seen = classify(code if code >= 0 else None, -code if code < 0 else None, tail,
                    hint=FailureClass.killed_by_guard)
    assert seen.cls is FailureClass.killed_by_guard
    assert not any(proctree.running(psutil.Process(pid)) for pid in guard.signals[0].pids if psutil.pid_exists(pid))
    assert min_available(guard) > SAFE_AVAILABLE
    assert_supervisor_reports_guard(failure)


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SPARKD_STANDIN_")}
