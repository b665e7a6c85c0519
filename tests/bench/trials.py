"""Kill trials: SIGKILL a supervised stand-in's main process at a chosen moment and time what follows.

A trial records, from outside: the kill (wall and monotonic clock), when the supervisor logged the death
(its own timestamp), when the bench's poller first saw ``/health`` answer 200 again, and — for a death that
leaves litter — whether the stale processes and /dev/shm files of the killed tree are gone afterwards.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchkit import SHM, Owned, ShmLedger, held_by, log, running, wait_healthy

NOTICE_WAIT_S = 3.0  # how long to wait for the supervisor's log line after the kill


def kill_once(peer: Any, pid: int, port: int, owned: Owned, ledger: ShmLedger, *, window: float,
              program: str | None = None) -> dict[str, Any]:
    """Kill ``pid`` (the stand-in's API server), then poll /health until 200 or ``window`` seconds."""
    tree = owned.add_tree(pid)
    names = held_by(tree)
    ledger.note(tree)
    if hasattr(peer, "snapshot"):
        peer.snapshot()
    mark = peer.log_mark() if hasattr(peer, "log_mark") else 0
    main = tree[0]
    wall, mono = time.time(), time.monotonic()
    main.kill()
    ready = wait_healthy(port, window)
    trial: dict[str, Any] = {"pid": pid, "recovered": ready is not None,
                             "recovery_s": None if ready is None else round(ready - mono, 4)}
    if hasattr(peer, "noticed_at"):
        kwargs = {"program": program} if program else {}
        deadline = time.monotonic() + NOTICE_WAIT_S
        noticed = peer.noticed_at(mark, pid, **kwargs)
        while noticed is None and time.monotonic() < deadline:
            time.sleep(0.05)
            noticed = peer.noticed_at(mark, pid, **kwargs)
        trial["detection_ms"] = None if noticed is None else round((noticed - wall) * 1000, 3)
        classified = peer.classified_at(mark, pid) if hasattr(peer, "classified_at") else None
        if classified is not None:
            trial["classified_ms"] = round((classified - wall) * 1000, 3)
    if hasattr(peer, "start_timing") and ready is not None:
        trial["start_timing"] = peer.start_timing()
        trial["path_ms"] = peer.path_ms(mark, pid)
    stale = [p for p in tree[1:] if running(p)]
    trial["stale_left"] = len(stale)
    trial["shm_left"] = sum(1 for name in names if (SHM / name).exists())
    return trial


def sequential(peer: Any, port: int, delays: list[float], owned: Owned, ledger: ShmLedger, *, window: float,
               label: str, before_kill: Any = None) -> list[dict[str, Any]]:
    """One supervisor, one stand-in: wait ready, wait ``delay``, kill; again with the next delay."""
    if wait_healthy(port, 120) is None:
        raise RuntimeError(f"{label}: the stand-in never became ready")
    pid = peer.main_pid()
    trials = []
    for n, delay in enumerate(delays, 1):
        time.sleep(delay)
        if before_kill is not None:
            before_kill()
        trial = kill_once(peer, pid, port, owned, ledger, window=window)
        trial["delay_s"] = delay
        trials.append(trial)
        log(f"  {label} {n}/{len(delays)}: recovery {trial['recovery_s']} s, detection "
            f"{trial.get('detection_ms')} ms, stale left {trial['stale_left']}")
        if not trial["recovered"]:
            break
        pid = peer.main_pid(old=pid)
    return trials


def parallel(jobs: list[tuple[Any, int, float, str | None]], owned: Owned, ledger: ShmLedger, *, window: float,
             label: str) -> list[dict[str, Any]]:
    """Many stand-ins at once, one kill each: ``(peer, port, kill at (s from now), program)`` per job.

    For supervisors whose recovery is a fixed wait (the unit's RestartSec=30) or never: the waits overlap and
    the kills are staggered so that no two restarts compete for the CPU."""
    start = time.monotonic()

    def one(job: tuple[Any, int, float, str | None]) -> dict[str, Any]:
        peer, port, at, program = job
        pid = peer.main_pid(program=program) if program else peer.main_pid()
        time.sleep(max(0.0, start + at - time.monotonic()))
        trial = kill_once(peer, pid, port, owned, ledger, window=window, program=program)
        trial["at_s"] = at
        log(f"  {label} {program or getattr(peer, 'unit', '')}: recovered {trial['recovered']} "
            f"({trial['recovery_s']} s), stale left {trial['stale_left']}")
        return trial

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(one, jobs))
