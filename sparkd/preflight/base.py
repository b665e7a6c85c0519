"""What every preflight check shares: the verdicts, one check's result, the context it reads, and ``Check``.

A check is a small async unit ``(ctx) -> CheckResult``. Its decision is a pure function of what it observed
(tested with tables in tests/unit); the I/O around it reads through ``ctx`` (``proc_root``, ``shm_dir``), so
tests point it at a view of /proc holding only their own processes, or at files of their own. Whatever must be
looked at where vLLM runs (inside its container, or on the host) is asked of ``ctx.runtime``: ``where``,
``exec``, ``read_file``; no check knows which runtime is configured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, overload

from sparkd.config import Config
from sparkd.host.gpu.model import GpuView
from sparkd.host.gpu.reading import read_gpus
from sparkd.launch.render import LaunchSpec
from sparkd.runtime.base import ImageIdentity, Runtime, engine_unreachable
from sparkd.supervisor.failures import FailureClass

GIB = 1 << 30
MIB = 1 << 20


class Verdict(StrEnum):
    ok = "ok"  # nothing to do
    fixed = "fixed"  # something was wrong and preflight put it right
    warn = "warn"  # worth knowing, or (dry run) what would be fixed; does not stop a launch
    fail = "fail"  # the node is not ready to launch


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    found: str  # what the check found: with verdict fail, the sentence of the failure
    did: str = ""  # what it did (or, dry run, would do)
    duration_s: float = 0.0
    failure_class: FailureClass | None = None  # with verdict fail: how the supervisor should treat it
    output: str = ""  # with verdict fail: what the program the check ran printed (vLLM's own words), if any
    id: str = ""  # the check's: stamped by ``Check`` when it runs (a check module never writes it)


@dataclass(frozen=True)
class PreflightContext:
    cfg: Config
    spec: LaunchSpec
    runtime: Runtime
    # Host PIDs of the watched instance's tree: never stale, never killed.
    protect: frozenset[int] = frozenset()
    # Report what would be fixed; change nothing.
    dry_run: bool = False
    shm_dir: Path = Path("/dev/shm")
    # Everything read from /proc goes through this root (processes, sockets, meminfo, sysctls, drop_caches).
    proc_root: Path = Path("/proc")
    # RDMA devices are read from <sys_root>/class/infiniband.
    sys_root: Path = Path("/sys")
    # The image vLLM runs from, read once per preflight (run_preflight fills it in); None on the host.
    image: ImageIdentity | None = None
    # The command that turns swap off when ``[preflight] apply_host`` is set.
    swapoff: tuple[str, ...] = ("swapoff", "-a")
    # Checks this run skips besides ``[preflight] skip``: check id -> why (a rehearsal's, sparkd.launch.rehearsal).
    skip: Mapping[str, str] = field(default_factory=dict)
    # A host PID in the launch's container (its init) when one runs, 0 when none does, None not asked yet: the
    # sweeps may act in that container's PID namespace besides sparkd's own (processes.launch_places).
    container_pid: int | None = None
    # The node's GPUs now (NVML, else nvidia-smi; tests give a fake NVML's): the gpu and memory checks read them.
    gpus: Callable[[], Awaitable[GpuView]] = read_gpus

    @property
    def record_path(self) -> Path:
        """The daemon's record of the instance it launched last."""
        return self.cfg.paths.state_dir / "instance.json"

    @property
    def never_touch(self) -> frozenset[int]:
        """PIDs no check may signal: the watched instance, ourselves, init."""
        return self.protect | {os.getpid(), 1}

    def report_only(self) -> PreflightContext:
        return replace(self, dry_run=True)


CheckFn = Callable[[PreflightContext], Awaitable[CheckResult]]


@dataclass(frozen=True)
class Check:
    """A named check. Calling it honours ``[preflight] skip`` and the context's ``skip``, and times the run."""

    id: str
    fn: CheckFn

    async def __call__(self, ctx: PreflightContext) -> CheckResult:
        started = time.monotonic()
        if self.id in ctx.cfg.preflight.skip:
            result = CheckResult(Verdict.ok, "skipped ([preflight] skip)")
        elif self.id in ctx.skip:
            result = CheckResult(Verdict.ok, f"skipped ({ctx.skip[self.id]})")
        else:
            try:
                result = await self.fn(ctx)
            except Exception as exc:  # a check's own bug must not take the daemon down, nor launch blind
                result = _crashed(self.id, exc)
        return replace(result, id=self.id, duration_s=time.monotonic() - started)


def _crashed(check_id: str, exc: Exception) -> CheckResult:
    if engine_unreachable(exc):  # waiting for the engine is not a failure of the node
        return CheckResult(Verdict.fail, f"the container engine does not answer ({exc}); sparkd waits "
                           "for it and checks again", failure_class=FailureClass.host_unavailable)
    return CheckResult(Verdict.fail, f"the check itself failed ({type(exc).__name__}: {exc}); to launch "
                       f"without it, add {check_id!r} to [preflight] skip", failure_class=FailureClass.unknown)


@overload
def check(fn: CheckFn, /) -> Check: ...
@overload
def check(check_id: str, /) -> Callable[[CheckFn], Check]: ...
def check(arg: CheckFn | str, /) -> Check | Callable[[CheckFn], Check]:
    """``@check`` on a check module's function: a ``Check`` whose id is the module's name (``sparkd/preflight/
    gpu.py`` is the check ``gpu``: the id is written once, in ``sparkd.config.supervision.PREFLIGHT_CHECKS``).
    ``@check("id")`` names it outright (a test's check, built where no module says it)."""
    if isinstance(arg, str):
        return lambda fn: Check(arg, fn)
    return Check(arg.__module__.rpartition(".")[2], arg)


def human_bytes(n: float) -> str:
    """``12.3 GiB``, ``456.0 MiB``, ``12 KiB``: sizes a person reads at a glance."""
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{int(n)} B"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_cmdline(proc_root: Path, pid: int) -> list[str] | None:
    """argv of ``pid`` as /proc shows it (a setproctitle title is argv[0], padded with NULs); None if gone."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part for part in raw.decode("utf-8", errors="replace").split("\0") if part]


def describe_cmdline(argv: list[str] | None, limit: int = 160) -> str:
    if not argv:
        return "?"
    text = " ".join(" ".join(arg.split()) for arg in argv)  # one line, whatever the arguments hold
    return text if len(text) <= limit else text[: limit - 3] + "..."


def visible_pids(proc_root: Path) -> list[int]:
    """The PIDs under ``proc_root``: the whole host for /proc, a test's own processes for a view of it."""
    try:
        return sorted(int(entry.name) for entry in os.scandir(proc_root) if entry.name.isdigit())
    except OSError:
        return []


def as_json(result: CheckResult) -> dict[str, Any]:
    return {
        "id": result.id, "verdict": result.verdict.value, "found": result.found, "did": result.did,
        "duration_s": round(result.duration_s, 4),
        "class": result.failure_class.value if result.failure_class else None,
    }
