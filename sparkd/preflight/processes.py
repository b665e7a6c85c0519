"""Check: no stale vLLM process is left on the node.

Stale is what :mod:`sparkd.preflight.neighbours` says it is, the one definition: a process of our own previous
launch (the daemon's ``instance.json``, the process proven by its launch marker, or else running what the
config launches: a reused PID or a forged record is not it), or a process titled with the launch's prefix
(``VLLM::`` unless the launch sets VLLM_PROCESS_NAME_PREFIX) that is orphaned — the tree that launched it is
gone — run by the launch's uid in its PID namespace; never part of another live sparkd instance's launch, never
the watched instance (``ctx.protect``). A live vLLM of someone else's, under its API server or launcher, is a
neighbour and is left alone. Stale processes get SIGTERM, a grace, then SIGKILL; each is reported with its PID
and command line.

The ports and GPU checks ask the same question ("is this holder stale?") through :func:`stale_candidates`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio
import psutil

from sparkd.config import Config
from sparkd.launch.render import LaunchSpec, effective_env, env_values
from sparkd.preflight import instances, neighbours, proctable, stale
from sparkd.preflight.base import (
    PreflightContext,
    Verdict,
    describe_cmdline,
    visible_pids,
)
from sparkd.preflight.shmholders import LEDGER_NAME, ShmLedger
from sparkd.runtime import proctree
from sparkd.state.files import json_state
from sparkd.state.schema import INSTANCE


@dataclass(frozen=True)
class Candidate:
    pid: int
    argv: list[str]
    why: str  # "orphaned" or "previous launch" (neighbours.Stale)

    def describe(self) -> str:
        return f"{self.pid} {describe_cmdline(self.argv)}"


def select(table: Mapping[int, neighbours.Proc], pids: Iterable[int], scope: neighbours.Scope) -> list[Candidate]:
    """Pure: the stale processes among ``pids`` (the titled ones and our previous launch's tree)."""
    return [Candidate(j.pid, list(table[j.pid].argv), j.stale.value)
            for j in neighbours.stale(list(pids), table, scope) if j.stale is not None]


def record_identity(record: Mapping[str, Any]) -> proctree.ProcessIdentity:
    """The identity a (validated) instance record names: its recorded one, or PID + create time only."""
    if record.get("identity"):
        return proctree.ProcessIdentity.from_record(record["identity"])
    return proctree.ProcessIdentity(pid=int(record["pid"]), create_time=float(record["create_time"]))


def expected_launch(cfg: Config, spec: LaunchSpec, prefix: str) -> proctree.Expected:
    """What the config launches (never what a record says): for proving a marker-less process ours."""
    script = cfg.launch.script if cfg.launch.script else str(cfg.paths.state_dir / "run" / "launch.sh")
    return proctree.Expected(executable=spec.argv[0] if spec.argv else "", script=script, title_prefix=prefix)


def recorded_root(record: Mapping[str, Any] | None, expected: proctree.Expected | None = None
                  ) -> neighbours.Launch | None:
    """The root of the launch in the daemon's record, if the live process is provably that launch
    (:func:`proctree.same_identity`: its launch marker, or else it runs what the config launches)."""
    if not record:
        return None
    root = proctree.same_identity(record_identity(record), expected)
    if root is None:
        return None
    try:
        return neighbours.Launch(root.pid, root.create_time(), "this node's previous launch")
    except psutil.Error:
        return None


def container_uid(cfg: Config) -> int | None:
    """The uid a container's processes run as, where the config says it in numbers; else any uid there (the
    container's PID namespace bounds the sweep)."""
    user = (cfg.container.user or "").split(":", 1)[0]
    return int(user) if user.isdigit() else None


def places(ctx: PreflightContext) -> tuple[neighbours.Place, ...]:
    """Where this launch's processes (and so its leftovers) can run: on the host, in sparkd's PID namespace as
    sparkd's uid; and, while the launch's container runs, in that container's namespace."""
    out = [neighbours.Place(proctable.own_pid_namespace(), os.geteuid())]
    if ctx.container_pid:
        ns = proctable.pid_namespace(ctx.container_pid)
        if ns is not None:
            out.append(neighbours.Place(ns, container_uid(ctx.cfg)))
    return tuple(p for p in out if p.pid_ns is not None)


async def launch_places(ctx: PreflightContext) -> PreflightContext:
    """``ctx`` with the launch's container (if one runs) asked of the runtime, once."""
    if ctx.container_pid is not None:
        return ctx
    try:
        pid = await ctx.runtime.container_pid()
    except Exception:  # the engine does not answer: the host place alone
        pid = 0
    return replace(ctx, container_pid=pid)


def other_launches(ctx: PreflightContext) -> tuple[neighbours.Launch, ...]:
    """The launches of the other live sparkd instances on this host (:mod:`sparkd.preflight.instances`)."""
    return instances.launches(instances.live_everywhere(ctx.cfg.paths.instances_dir, besides=ctx.cfg.paths.state_dir))


def title_prefix(ctx: PreflightContext) -> str:
    """The title prefix of our launch's processes (``VLLM::`` unless the launch sets VLLM_PROCESS_NAME_PREFIX)."""
    return launch_title_prefix(ctx.cfg, ctx.runtime.name, ctx.spec.env)


def launch_title_prefix(cfg: Config, runtime: str, env: Mapping[str, str]) -> str:
    """The title prefix vLLM takes from the environment it starts with (:func:`effective_env`: on the host,
    sparkd's own under the launch's exports; in a container, ``[container] env`` under them)."""
    return stale.title_prefix(env_values(effective_env(cfg, exports=env, runtime=runtime)))


def scope(ctx: PreflightContext, ours: neighbours.Launch | None = None) -> neighbours.Scope:
    return neighbours.Scope(prefix=title_prefix(ctx), places=places(ctx), ours=ours, others=other_launches(ctx),
                            never_touch=ctx.never_touch)


def _ours(ctx: PreflightContext) -> neighbours.Launch | None:
    record = json_state(ctx.record_path, INSTANCE).peek()  # a bad record is the daemon's to set aside
    return recorded_root(record, expected_launch(ctx.cfg, ctx.spec, title_prefix(ctx)))


def stale_candidates(ctx: PreflightContext) -> list[Candidate]:
    ours = _ours(ctx)
    visible = set(visible_pids(ctx.proc_root))
    members = {p.pid for p in proctree.tree(ours.pid)} & visible if ours is not None else set()
    pids = set(stale.titled(ctx.proc_root, title_prefix(ctx))) | members
    return select(proctable.table(pids, ctx.proc_root), pids, scope(ctx, ours))


def judge(ctx: PreflightContext, pids: Iterable[int]) -> dict[int, neighbours.Judgement]:
    """Each of ``pids`` judged by the one definition: stale (and why) or a neighbour (and whose)."""
    wanted = sorted(set(pids))
    table = proctable.table(wanted, ctx.proc_root)
    found = scope(ctx, _ours(ctx))
    return {pid: neighbours.judge(pid, table, found) for pid in wanted}


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
