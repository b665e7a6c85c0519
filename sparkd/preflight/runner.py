"""Run the preflight checks in order and turn their verdicts into one report (and a failure, if any).

The order matters: the container and the launch target first (nothing else is worth doing for a launch that
cannot run), then vLLM's parse of the argv (seconds, not a cold start), then the cleanup (stale processes, which
frees their ports, GPU and /dev/shm segments; then ports and /dev/shm), then memory (drop the page cache, then
judge what is free), then host settings, the image, RDMA and the GPU.

The image vLLM runs from is read once at the start of every preflight (a tag may have moved since the last
one); the report carries it (``PreflightReport.image``) for the pair's image comparison.
"""

from __future__ import annotations

import fcntl
import importlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkd.config import Config
from sparkd.config.supervision import PREFLIGHT_CHECKS
from sparkd.launch.render import LaunchSpec
from sparkd.preflight.base import Check, CheckResult, PreflightContext, Verdict, as_json
from sparkd.preflight.dev_shm import check_shm
from sparkd.preflight.processes import launch_places
from sparkd.preflight.stale_processes import check_stale_processes
from sparkd.runtime import proctree
from sparkd.runtime.base import ImageIdentity, Runtime
from sparkd.state.files import read_json
from sparkd.supervisor.failures import Failure, FailureClass

__all__ = [
    "CHECK_IDS", "DEFAULT_CHECKS", "CheckResult", "PreflightContext", "PreflightReport", "Verdict", "check_shm",
    "check_stale_processes", "load_check", "run_preflight", "run_standalone", "watched_pids",
]

CheckCallable = Callable[[PreflightContext], Awaitable[CheckResult]]


def load_check(check_id: str) -> Check:
    """The check ``check_id``: the ``@check`` of its module, ``sparkd/preflight/<check_id>.py``."""
    module = importlib.import_module(f"{__package__}.{check_id}")
    found = [c for c in vars(module).values() if isinstance(c, Check) and c.id == check_id]
    if len(found) != 1:
        raise LookupError(f"sparkd/preflight/{check_id}.py defines {len(found)} @check functions, not one")
    return found[0]


# In the order of PREFLIGHT_CHECKS (the stop sweep reuses two of them: check_stale_processes, check_shm).
DEFAULT_CHECKS: tuple[Check, ...] = tuple(load_check(check_id) for check_id in PREFLIGHT_CHECKS)
CHECK_IDS: tuple[str, ...] = PREFLIGHT_CHECKS


@dataclass(frozen=True)
class PreflightReport:
    results: list[CheckResult] = field(default_factory=list)
    dry_run: bool = False
    image: ImageIdentity | None = None  # the image vLLM runs from, as read by this preflight

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
        return [as_json(r) for r in self.results]

    def summary(self) -> dict[str, Any]:
        failure = self.failure()
        return {
            "ok": self.ok, "dry_run": self.dry_run, "results": self.to_json(),
            "failure": None if failure is None else {"class": failure.cls.value, "message": failure.sentence},
            "image": self.image.to_json() if self.image else None,
        }


async def run_preflight(ctx: PreflightContext, checks: tuple[CheckCallable, ...] = DEFAULT_CHECKS, *,
                        report_rest: bool = False) -> PreflightReport:
    """Run ``checks`` in order. At the first failure stop, or (``report_rest``) run the rest report-only:
    once the node will not launch, nothing more is changed on it. The image is read first, every time."""
    if ctx.image is None:
        ctx = replace(ctx, image=await ctx.runtime.image_identity())
    ctx = await launch_places(ctx)
    results: list[CheckResult] = []
    failed = False
    for run in checks:
        if failed and not report_rest:
            break
        result = await run(ctx.report_only() if failed else ctx)
        results.append(result)
        failed = failed or result.verdict is Verdict.fail
    return PreflightReport(results, dry_run=ctx.dry_run, image=ctx.image)


# ---- sparkd preflight (one-shot) ------------------------------------------------------------------------


def daemon_running(state_dir: Path) -> bool:
    """Whether a sparkd daemon holds this node's lock (``<state_dir>/sparkd.lock``)."""
    try:
        fd = os.open(state_dir / "sparkd.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock we got
    return False


def watched_pids(cfg: Config) -> frozenset[int]:
    """The process tree of the instance a running daemon watches: never stale for a one-shot preflight.

    With no daemon running, the recorded instance is a leftover of our previous launch, and stale."""
    if not daemon_running(cfg.paths.state_dir):
        return frozenset()
    record = read_json(cfg.paths.state_dir / "instance.json") or {}
    try:
        pid, created = int(record["pid"]), float(record["create_time"])
    except (KeyError, TypeError, ValueError):
        return frozenset()
    if proctree.same_process(pid, created) is None:
        return frozenset()
    return frozenset(proctree.tree_pids(pid))


async def run_standalone(cfg: Config, spec: LaunchSpec, runtime: Runtime, *, dry_run: bool,
                         checks: tuple[CheckCallable, ...] = DEFAULT_CHECKS) -> PreflightReport:
    """``sparkd preflight``: every check (or ``checks``), reported in full (after a failure the rest run
    report-only)."""
    ctx = PreflightContext(cfg=cfg, spec=spec, runtime=runtime, protect=watched_pids(cfg), dry_run=dry_run)
    return await run_preflight(ctx, checks, report_rest=True)
