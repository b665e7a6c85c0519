"""``GET /v1/status`` — ``sparkctl status``: node, role, rank, state, phase, uptime, PID, restarts, last failure,
the breaker, the guard's decision and every peer. Exit codes follow LSB: 0 ready, 1 degraded or failed,
3 not serving (stopped, starting, backoff, …), 4 the daemon is unreachable (sparkctl's own); and sparkctl's
``--wait`` that runs out of time exits 124 (``EXIT_TIMEOUT``, as ``timeout(1)`` does), apart from a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkd.commands.accept import status_lines
from sparkd.commands.base import NoParams, Reply, ok
from sparkd.commands.command import Cli, Command
from sparkd.host.timefmt import iso
from sparkd.supervisor.runbook import failure_ref

if TYPE_CHECKING:  # the fast path of `sparkctl status` imports this module
    from sparkd.commands.port import Control
    from sparkd.commands.statusdoc import Status

EXIT_READY, EXIT_UNHEALTHY, EXIT_NOT_SERVING, EXIT_UNREACHABLE = 0, 1, 3, 4
EXIT_TIMEOUT = 124


Request = NoParams


async def execute(control: Control, request: Request) -> Reply:
    return ok(control.status())


def exit_code(status: Status) -> int:
    state, daemon = status.get("state"), status.get("daemon")
    if state == "ready" and not (daemon and daemon.get("degraded")):
        return EXIT_READY
    if state in ("ready", "degraded", "failed"):
        return EXIT_UNHEALTHY
    return EXIT_NOT_SERVING


def when(ts: float | None) -> str:
    """ISO 8601 with the zone (``2026-11-27T05:36:36+01:00``): a pasted status says which moment it was."""
    return iso(ts)


def render(s: Status) -> str:
    rank = f", rank {s['rank']}" if s.get("pair") else ""
    lines = [f"sparkd {s.get('version', '?')} on {s['node']} ({s['role']}{rank}, {s['runtime']}): "
             f"{s['state']} since {when(s.get('since'))}"]
    facts = [f"pid {s['pid']}" if s.get("pid") else "no vLLM process", f"restarts {s['restarts']}"]
    if s.get("uptime_s") is not None:
        facts.append(f"ready for {s['uptime_s']:.0f} s")
    if s.get("phase"):
        shards = s.get("shards")
        facts.append(f"phase {s['phase']}" + (f" ({shards[0]}/{shards[1]} shards)" if shards else ""))
    if s.get("intent") == "stop":
        facts.append("kept stopped (sparkctl start to run it)")
    lines.append("  " + ", ".join(facts))
    if s.get("health"):
        lines.append(f"  health: {s['health']}")
    if s.get("watch_note"):
        lines.append(f"  note: {s['watch_note']}")
    drain = s.get("drain")
    if drain and drain.get("state") == "draining":
        lines.append(f"  {drain['sentence']} (`sparkctl stop --now` cuts it short)")
    steps = s.get("steps") or {}
    if steps.get("warning"):
        lines.append(f"  step probe: {steps['warning']}")
    if s.get("backoff_until"):
        lines.append(f"  next start at {when(s['backoff_until'])}")
    breaker = s.get("breaker")
    if breaker and breaker.get("open"):
        lines.append(f"  breaker OPEN: {breaker['reason']}")
    failure = s.get("last_failure")
    if failure:
        lines.append(f"  last failure ({failure['class']}, {when(failure.get('at'))}): {failure['message']}")
        lines.append(f"  runbook: {runbook(s, failure['class'])}")
    for drift in s.get("drift") or []:
        lines.append(f"  container drift: {drift.get('key')}: {drift.get('actual')!r} in the container, "
                     f"{drift.get('configured')!r} in the config (`sparkctl recreate` while stopped)")
    lines.extend(_timing(s.get("start_timing") or {}))
    lines.extend(status_lines(s.get("acceptance") or {}))
    lines.extend(_config(s.get("config") or {}))
    daemon = s.get("daemon")
    for problem in (daemon.get("problems") if daemon else None) or []:
        lines.append(f"  sparkd degraded: {problem}")
    lines.extend(_notify(s.get("notify") or {}))
    lines.extend(_memory(s.get("memory") or {}))
    lines.extend(_gpu(s.get("gpu") or {}))
    stop = s.get("last_stop")
    if stop:
        lines.append(f"  last stop: {stop['sentence']}")
    for peer in s.get("peers") or []:
        where = f"{peer.get('node') or peer['peer']} (rank {peer.get('rank', '?')})"
        state = peer.get("state") if peer.get("reachable") else "unreachable"
        pid = f", pid {peer['pid']}" if peer.get("pid") else ""
        failed = f", last failure {peer['last_failure']}" if peer.get("last_failure") else ""
        lines.append(f"  peer {where} at {peer['peer']}: {state}{pid}{failed}")
    return "\n".join(lines)


def runbook(s: Status, cls: str) -> str:
    """Where the runbook says what to do about failure class ``cls``: on the node's own HTTP port when the status
    says where that is (``runbook``: ``http://host:9479``), else the path on it."""
    base = s.get("runbook")
    return failure_ref(cls, base) if base else f"{failure_ref(cls)} on sparkd's HTTP port (:9479 by default)"


def _timing(timing: Mapping[str, Any]) -> list[str]:
    if not timing or timing.get("adopted") or timing.get("sparkd_s") is None:
        return []
    slowest = max(timing["steps_s"].items(), key=lambda kv: kv[1], default=("?", 0.0))
    line = f"  last start: sparkd {timing['sparkd_s']:.2f} s to exec (slowest: {slowest[0]} {slowest[1]:.2f} s)"
    if timing.get("phases_s"):
        line += ", vLLM " + ", ".join(f"{phase} {secs:.1f} s" for phase, secs in timing["phases_s"].items())
    if timing.get("accept_s") is not None:
        line += f", the acceptance gate {timing['accept_s']:.1f} s"
    cache = timing.get("compile_cache")
    return [line, *([f"  start: {cache['sentence']}"] if cache and cache.get("sentence") else [])]


def _config(config: Mapping[str, Any]) -> list[str]:
    breaker = [f"  {config['breaker']}"] if config.get("breaker") else []
    if not config.get("path"):
        return breaker
    if not config.get("valid", True):
        return [f"  the config on disk is invalid ({'; '.join(config.get('problems') or [])}): "
                "sparkd keeps the one it loaded", *breaker]
    lines = breaker
    if config.get("reload_needed"):
        lines.append(f"  {config['path']} changed since sparkd loaded it: `sparkctl reload` takes it on")
    if config.get("restart_needed"):
        lines.append("  the running vLLM was launched from an older config: `sparkctl restart` launches the one "
                     "on disk")
    return lines


def _notify(notify: Mapping[str, Any]) -> list[str]:
    """A failing webhook each on its line (its URL masked), a target that cannot be used, or one line when all is
    well."""
    lines = [f"  notify: {problem}" for problem in notify.get("problems") or []]
    targets = notify.get("targets") or []
    for t in targets:
        if t.get("state") != "failing":
            continue
        retry = f"; next try in {t['next_try_in_s']:.0f} s" if t.get("next_try_in_s") is not None else ""
        lines.append(f"  notify {t['name']} ({t['url']}) FAILING since {when(t.get('failing_since'))}, "
                     f"{t['failures']} tries: {t.get('last_error')}{retry}; {t.get('queued', 0)} waiting, "
                     f"{t.get('dropped', 0)} dropped")
    if targets and not lines:
        sent = sum(t.get("sent", 0) for t in targets)
        held = sum(t.get("held_back", 0) for t in targets)
        lines.append(f"  notify: {len(targets)} target{'s' if len(targets) != 1 else ''} ok, {sent} sent"
                     + (f", {held} held back by the rate limit" if held else ""))
    return lines


def _memory(memory: Mapping[str, Any]) -> list[str]:
    lines = []
    if memory.get("available_bytes") is not None:
        lines.append(f"  memory available: {memory['available_bytes'] / 2**30:.1f} GiB")
    guard = memory.get("guard")
    if guard:
        gate = "allows starts" if guard.get("start_allowed") else "refuses starts"
        lines.append(f"  memory guard: {guard['action']} ({guard['level']}), {gate}: {guard['reason']}")
    return lines


def _gpu(gpu: Mapping[str, Any]) -> list[str]:
    if not gpu.get("devices"):
        return []
    lines = []
    for d in gpu["devices"]:
        if not d.get("in_launch"):
            continue
        if d.get("unified"):
            memory = "unified memory (the host's)"
        elif d.get("total_bytes") is not None and d.get("free_bytes") is not None:
            memory = f"{d['free_bytes'] / 2**30:.1f} of {d['total_bytes'] / 2**30:.1f} GiB free"
        else:
            memory = "memory not readable"
        facts = [memory] + [f"{d[k]:.0f} {unit}" for k, unit in (("power_w", "W"), ("utilization_pct", "%"),
                                                               ("temperature_c", "°C")) if d.get(k) is not None]
        lines.append(f"  GPU {d['index']} ({d.get('name') or '?'}): " + ", ".join(facts))
    return lines


COMMAND: Command[NoParams, Status] = Command(
    "status", "GET", NoParams, execute, render, exit_code,
    Cli(help="Node, role, state, phase, uptime, PID, restarts, last failure, breaker, guard and peers."))
