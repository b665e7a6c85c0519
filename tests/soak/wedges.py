"""The stand-in's run-time faults: a rank that is serving stalls, hangs or leaks (its control file, see
``standin/sparkd_standin/control.py``), and the next launch runs clean.

- stall: the head's engine completes no step again; /health stays 200 (only the canary and the stall clock
  can tell);
- hang: the head's API server stops answering (connections are accepted, nothing is answered);
- leak: the head's worker allocates real, resident memory. The head's guard floors are lowered (a reload)
  to just under this machine's MemAvailable for the fault's duration, so that the guard, not the machine,
  ends it; the leak is capped well above the floor and the fault is skipped on a machine without room.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import psutil
from daemon_harness import render_toml, tree
from faults import Skipped, ctl
from invariants import Ledger
from soakpair import SoakPair

from sparkd.guard.meminfo import read_meminfo

GIB = 1 << 30
MIB = 1 << 20
LEAK_ROOM = 8 * GIB  # MemAvailable needed to run the leak fault (it takes at most LEAK_CAP_MB of it)
LEAK_CAP_MB = 2048
GUARD_S = 60.0  # the guard ends the leak within this


def stall(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    pair.command("head", "stall")
    return "the head's engine stalled (health stays 200)"


def hang(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    pair.command("head", "hang")
    return "the head's API server hung"


def guard_floors(available: int) -> dict[str, int]:
    """Floors for a leak fault: the guard stops vLLM once 1 GiB of ``available`` is gone, kills it at 1.5 GiB."""
    stop = available - GIB
    return {"stop_below": stop, "kill_below": stop - GIB // 2, "warn_below": stop + GIB // 4,
            "refuse_start_below": stop}


def leak(pair: SoakPair, params: dict[str, Any], ledger: Ledger) -> str:
    meminfo = read_meminfo()
    available = meminfo.mem_available if meminfo is not None else 0
    if available < LEAK_ROOM:
        raise Skipped(f"MemAvailable {available / GIB:.1f} GiB: too little room to leak safely")
    head = pair.head
    original = head.config_path.read_text()
    before = (pair.status("head").get("last_failure") or {}).get("at")
    lowered = copy.deepcopy(head.config)
    lowered["guard"].update(guard_floors(available))
    try:
        head.config_path.write_text(render_toml(lowered))
        reload = ctl(pair, "head", "reload")
        if reload.returncode != 0:
            ledger.add("the head refused a valid config that lowers the guard's floors",
                       (reload.stdout + reload.stderr)[-300:])
            return "the guard's floors could not be lowered"
        pair.command("head", f"leak {params['mb_per_s']} {LEAK_CAP_MB}")
        failure, lowest = _wait_for_failure(pair, before, GUARD_S)
    finally:
        head.config_path.write_text(original)
        restored = ctl(pair, "head", "reload")
    if restored.returncode != 0:
        ledger.add("the head refused its own config back after a leak", (restored.stdout + restored.stderr)[-300:])
    if failure is None:
        return _no_guard_stop(pair, params, ledger, available, lowest)
    if failure.get("class") != "killed_by_guard":
        ledger.add("a leak ended in another failure than the memory guard's stop", str(failure.get("message")))
    return f"leak {params['mb_per_s']} MB/s: {failure.get('class')}: {str(failure.get('message'))[:80]}"


def _no_guard_stop(pair: SoakPair, params: dict[str, Any], ledger: Ledger, available: int, lowest: int) -> str:
    """The guard did not stop the leak. A violation when MemAvailable went well under the stop floor (or the
    worker never leaked); when it never got there, the host's memory moved under the fault (other programs
    freed memory meanwhile) and nothing is proven. Either way the leaking instance is restarted."""
    stop = guard_floors(available)["stop_below"]
    seen = (f"MemAvailable {available >> 20} MiB at the start, {lowest >> 20} MiB at the lowest; stop floor "
            f"{stop >> 20} MiB; the head's processes (MiB): {_rss(pair)}")
    leaked = max(_resident(pair), default=0) >= LEAK_CAP_MB // 2 * MIB
    if not leaked:
        ledger.add("the head's worker did not take the leak command", seen)
    elif lowest < stop - GIB // 4:
        ledger.add(f"the memory guard did not end a leak within {GUARD_S:.0f} s", seen)
    ctl(pair, "head", "restart")
    verdict = "no guard stop" if leaked and lowest < stop - GIB // 4 else "inconclusive"
    return f"leak {params['mb_per_s']} MB/s: {verdict} ({seen}); restarted"


def _wait_for_failure(pair: SoakPair, before: Any, timeout: float) -> tuple[dict[str, Any] | None, int]:
    """The head's next failure (or None), and the lowest MemAvailable seen meanwhile."""
    deadline, lowest = time.monotonic() + timeout, 1 << 62
    while time.monotonic() < deadline:
        meminfo = read_meminfo()
        lowest = min(lowest, meminfo.mem_available if meminfo is not None else lowest)
        failure = pair.status("head").get("last_failure") or {}
        if failure.get("at") not in (None, before):
            return failure, lowest
        time.sleep(0.2)
    return None, lowest


def _rss(pair: SoakPair) -> str:
    """The head's processes with their resident memory (MiB), for a violation's details."""
    out = []
    for proc in tree(pair.rank_pid("head") or 0):
        with contextlib.suppress(psutil.Error, IndexError):
            out.append(f"{proc.pid} {proc.cmdline()[0][-24:]} {proc.memory_info().rss >> 20}")
    return ", ".join(out) or "none"


def _resident(pair: SoakPair) -> list[int]:
    out = []
    for proc in tree(pair.rank_pid("head") or 0):
        with contextlib.suppress(psutil.Error):
            out.append(proc.memory_info().rss)
    return out
