"""Check: no stale vLLM process is left on the node.

Stale means titled ``VLLM::*`` (EngineCore, Worker_TP*; the prefix is the launch's VLLM_PROCESS_NAME_PREFIX when
it sets one), or part of the process tree of our own previous
launch as the daemon's ``instance.json`` records it, when the process is provably that launch (its launch
marker, or else it runs what the config launches: a reused PID or a forged record is not it), and never
part of the watched instance (``ctx.protect``). Stale processes get SIGTERM, a grace, then SIGKILL; each is
reported with its PID and command line. Nothing else is ever touched.

The ports and GPU checks ask the same question ("is this holder stale?") through :func:`stale_candidates`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from sparkd.config import Config
from sparkd.launch import LaunchSpec
from sparkd.preflight import stale
from sparkd.preflight.base import (
    CheckResult,
    PreflightContext,
    Verdict,
    check,
    describe_cmdline,
    read_cmdline,
    visible_pids,
)
from sparkd.preflight.shmholders import LEDGER_NAME, ShmLedger
from sparkd.runtime import proctree
from sparkd.statefile import json_state
from sparkd.stateschema import INSTANCE
from sparkd.supervisor.failures import FailureClass


@dataclass(frozen=True)
class Candidate:
    pid: int
    argv: list[str]
    why: str  # "title" or "previous launch"

    def describe(self) -> str:
        return f"{self.pid} {describe_cmdline(self.argv)}"


def select(titled: Mapping[int, list[str]], recorded: Mapping[int, list[str]],
           never_touch: frozenset[int], prefix: str = stale.TITLE_PREFIX) -> list[Candidate]:
    """Pure: the stale processes among those titled VLLM::* and those of our previous launch's tree."""
    out: dict[int, Candidate] = {}
    for pid, argv in recorded.items():
        if pid not in never_touch:
            out[pid] = Candidate(pid, argv, "previous launch")
    for pid, argv in titled.items():
        if pid not in never_touch and stale.is_vllm_title(argv, prefix):
            out.setdefault(pid, Candidate(pid, argv, "title"))
    return [out[pid] for pid in sorted(out)]


def record_identity(record: Mapping[str, Any]) -> proctree.ProcessIdentity:
    """The identity a (validated) instance record names: its recorded one, or PID + create time only."""
    if record.get("identity"):
        return proctree.ProcessIdentity.from_record(record["identity"])
    return proctree.ProcessIdentity(pid=int(record["pid"]), create_time=float(record["create_time"]))


def expected_launch(cfg: Config, spec: LaunchSpec, prefix: str) -> proctree.Expected:
    """What the config launches (never what a record says): for proving a marker-less process ours."""
    script = cfg.launch.script if cfg.launch.script else str(cfg.paths.state_dir / "run" / "launch.sh")
    return proctree.Expected(executable=spec.argv[0] if spec.argv else "", script=script, title_prefix=prefix)


def recorded_tree(record: Mapping[str, Any] | None, proc_root: Path,
                  expected: proctree.Expected | None = None) -> dict[int, list[str]]:
    """The live process tree of the launch in the daemon's record, if the process is provably that launch
    (:func:`proctree.same_identity`: its launch marker, or else it runs what the config launches)."""
    if not record:
        return {}
    root = proctree.same_identity(record_identity(record), expected)
    if root is None:
        return {}
    visible = set(visible_pids(proc_root))
    out = {}
    for member in proctree.tree(root.pid):
        argv = read_cmdline(proc_root, member.pid) if member.pid in visible else None
        if argv:
            out[member.pid] = argv
    return out


def title_prefix(ctx: PreflightContext) -> str:
    """The title prefix of our launch's processes (``VLLM::`` unless the launch sets VLLM_PROCESS_NAME_PREFIX)."""
    return stale.title_prefix(ctx.spec.env, ctx.cfg.container.env)


def stale_candidates(ctx: PreflightContext) -> list[Candidate]:
    record = json_state(ctx.record_path, INSTANCE).peek()  # a bad record is the daemon's to set aside
    prefix = title_prefix(ctx)
    expected = expected_launch(ctx.cfg, ctx.spec, prefix)
    return select(stale.titled(ctx.proc_root, prefix), recorded_tree(record, ctx.proc_root, expected),
                  ctx.never_touch, prefix)


async def end_candidates(ctx: PreflightContext, candidates: list[Candidate]
                         ) -> tuple[list[stale.StaleProcess], list[stale.StaleProcess]]:
    """SIGTERM, grace, SIGKILL the candidates still showing the argv they were found with.

    First the /dev/shm segments they hold go into the ledger: once they are dead, the sweep may remove them."""
    bound = [p for p in (stale.bind(c.pid, c.argv) for c in candidates) if p is not None]
    if bound:
        ledger = ShmLedger(ctx.cfg.paths.state_dir / LEDGER_NAME)
        await anyio.to_thread.run_sync(lambda: ledger.note([p.pid for p in bound], ctx.shm_dir, ctx.proc_root))
    return await stale.end(bound, ctx.cfg.preflight.kill_grace_s)


def verdict(found: list[Candidate], survivors: list[stale.StaleProcess], *, dry_run: bool
            ) -> tuple[Verdict, str, str]:
    """Pure: (verdict, found, did) for what was found and what outlived SIGKILL."""
    if not found:
        return Verdict.ok, "no stale vLLM process", ""
    listed = "; ".join(f"{c.describe()} ({c.why})" for c in found)
    text = f"{len(found)} stale vLLM process(es): {listed}"
    if dry_run:
        return Verdict.warn, text, "would SIGTERM, wait, then SIGKILL them"
    if survivors:
        left = "; ".join(f"{s.pid} {s.cmdline}" for s in survivors)
        return (Verdict.fail, f"{len(survivors)} stale vLLM process(es) outlived SIGKILL: {left} "
                "(stuck in the kernel, likely on the GPU driver; a reboot is likely needed)",
                f"sent SIGTERM then SIGKILL to {len(found)}")
    return Verdict.fixed, text, f"ended {len(found)} process(es) with SIGTERM/SIGKILL"


@check("stale_processes")
async def check_stale_processes(ctx: PreflightContext) -> CheckResult:
    found = await anyio.to_thread.run_sync(stale_candidates, ctx)
    survivors: list[stale.StaleProcess] = []
    if found and not ctx.dry_run:
        _, survivors = await end_candidates(ctx, found)
    v, text, did = verdict(found, survivors, dry_run=ctx.dry_run)
    return CheckResult("stale_processes", v, text, did,
                       failure_class=FailureClass.gpu_busy if v is Verdict.fail else None)
