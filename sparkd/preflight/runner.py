"""Run the preflight checks in order and turn their verdicts into one report (and a failure, if any)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from sparkd.config import Config
from sparkd.launch import LaunchSpec
from sparkd.preflight import shm, stale
from sparkd.runtime.base import Runtime
from sparkd.supervisor.classify import Failure, FailureClass


class Verdict(StrEnum):
    ok = "ok"
    fixed = "fixed"
    warn = "warn"
    fail = "fail"


@dataclass(frozen=True)
class CheckResult:
    id: str
    verdict: Verdict
    found: str
    did: str = ""
    duration_s: float = 0.0
    failure_class: FailureClass | None = None  # with verdict fail: how the supervisor should treat it


@dataclass(frozen=True)
class PreflightReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.verdict is not Verdict.fail for r in self.results)

    def failure(self) -> Failure | None:
        for r in self.results:
            if r.verdict is Verdict.fail:
                cls = r.failure_class or FailureClass.unknown
                return Failure(cls=cls, sentence=f"Preflight {r.id} failed: {r.found}", exit_code=None,
                               signal=None, evidence=None)
        return None

    def to_json(self) -> list[dict[str, object]]:
        return [{"id": r.id, "verdict": r.verdict.value, "found": r.found, "did": r.did,
                 "duration_s": round(r.duration_s, 4)} for r in self.results]


@dataclass(frozen=True)
class PreflightContext:
    cfg: Config
    spec: LaunchSpec
    runtime: Runtime
    protect: frozenset[int] = frozenset()
    dry_run: bool = False
    shm_dir: Path = Path("/dev/shm")


Check = Callable[[PreflightContext], Awaitable[CheckResult]]


async def check_launch_target(ctx: PreflightContext) -> CheckResult:
    problem = await ctx.runtime.missing_target(ctx.spec)
    if problem:
        return CheckResult("launch_target", Verdict.fail, problem, failure_class=FailureClass.config_error)
    return CheckResult("launch_target", Verdict.ok, f"{ctx.spec.argv[0]} is there")


async def check_stale_processes(ctx: PreflightContext) -> CheckResult:
    procs = stale.find_stale(ctx.protect)
    if not procs:
        return CheckResult("stale_processes", Verdict.ok, "no stale VLLM::* process")
    found = "; ".join(f"{p.pid} {p.cmdline}" for p in map(stale.describe, procs))
    if ctx.dry_run:
        return CheckResult("stale_processes", Verdict.warn, found, "would SIGTERM, then SIGKILL")
    ended = await stale.kill_stale(procs)
    return CheckResult("stale_processes", Verdict.fixed, found, f"ended {len(ended)} process(es)")


async def check_shm(ctx: PreflightContext) -> CheckResult:
    removed = shm.sweep(ctx.shm_dir, dry_run=ctx.dry_run)
    if not removed:
        return CheckResult("dev_shm", Verdict.ok, f"no leaked segment in {ctx.shm_dir}")
    size = sum(s.size for s in removed)
    names = ", ".join(s.name for s in removed[:10]) + (" ..." if len(removed) > 10 else "")
    did = "would remove" if ctx.dry_run else "removed"
    return CheckResult("dev_shm", Verdict.warn if ctx.dry_run else Verdict.fixed,
                       f"{len(removed)} leaked segment(s): {names}", f"{did} them, {size} bytes")


DEFAULT_CHECKS: tuple[Check, ...] = (check_launch_target, check_stale_processes, check_shm)


async def run_preflight(ctx: PreflightContext, checks: tuple[Check, ...] = DEFAULT_CHECKS) -> PreflightReport:
    results = []
    for check in checks:
        started = time.monotonic()
        result = await check(ctx)
        results.append(CheckResult(**{**result.__dict__, "duration_s": time.monotonic() - started}))
        if result.verdict is Verdict.fail:
            break
    return PreflightReport(results)
