"""``sparkctl postmortem [--since WHEN] [--local] [--json]``: what happened before each node went silent.

It asks the local daemon for every node's flight-recorder runs (the daemon asks its peers through the peer API),
finds the silences, then asks for the minutes around each one and prints the analysis of
:mod:`sparkd.recorder.postmortem`: one sentence each, newest first, with the records that show it. When the
daemon does not answer, it reads this node's ring itself (from ``--config``) and says the peers were not asked.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from sparkd.api.client import ActionRefused, DaemonUnreachable
from sparkd.commands import recorder
from sparkd.config import DEFAULT_CONFIG_PATH
from sparkd.guard.sample import gib
from sparkd.recorder.postmortem import AFTER_S, WINDOW_S, NodeRing, Report, analyse, node_from_json, silences
from sparkd.recorder.record import GpuMark, Record

__all__ = ["parse_since", "postmortem", "render"]

MAX_SILENCES = 5  # the newest silences whose minutes are fetched
HEARD_S = 3600.0  # for a node that cannot be read: the last hour of the others' records
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")


def parse_since(text: str | None, now: float) -> float | None:
    """``90s``, ``30m``, ``2h``, ``1d`` ago; an ISO time (``2026-11-27T03:00``, UTC unless it says); or epoch
    seconds. ValueError naming the spelling."""
    if text is None:
        return None
    text = text.strip()
    m = _AGO.match(text.lower())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: expected a duration like 30m, 2h, 1d, an ISO time like "
                         "2026-11-27T03:00 (UTC) or seconds since the epoch") from None
    if stamp.tzinfo is None:
        return stamp.replace(tzinfo=UTC).timestamp()
    return stamp.timestamp()


def _ranges(nodes: list[NodeRing], since: float | None) -> list[tuple[float, float]]:
    """The time ranges whose records the analysis needs: the minutes around each silence (newest first, merged)."""
    ranges = []
    for node in nodes:
        if node.error is not None and not node.runs:
            now = max((n.now or 0.0) for n in nodes) or time.time()
            ranges.append((now - HEARD_S, now))
        for s in silences(node):
            ranges.append((s.at - WINDOW_S - 60, s.at + AFTER_S + 60))
    ranges = sorted((max(a, since) if since else a, b) for a, b in ranges)[-MAX_SILENCES:]
    merged: list[tuple[float, float]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _fetch(obj: Any, since: float | None, local: bool) -> tuple[str, list[NodeRing], list[str]]:
    notes: list[str] = []
    try:
        with obj.client(timeout_s=90) as client:
            first = client.call(recorder.COMMAND, recorder.Request(since=since, local=local), timeout_s=90)
            nodes = [node_from_json(n) for n in first["nodes"]]
            records: dict[str, list[dict[str, Any]]] = {}
            for a, b in _ranges(nodes, since):
                more = client.call(recorder.COMMAND, recorder.Request(since=a, until=b, local=local), timeout_s=90)
                for n in more["nodes"]:
                    records.setdefault(str(n.get("node")), []).extend(n.get("records") or [])
            answers = [{**n, "records": records.get(str(n.get("node")), [])} for n in first["nodes"]]
            return str(first["reference"]), [node_from_json(n) for n in answers], notes
    except DaemonUnreachable as exc:
        notes.append(f"sparkd does not answer ({exc}); this node's ring was read directly and no peer was asked")
    except ActionRefused as exc:
        notes.append(f"sparkd refused ({exc}); this node's ring was read directly and no peer was asked")
    return _read_locally(obj, since, notes)


def _read_locally(obj: Any, since: float | None, notes: list[str]) -> tuple[str, list[NodeRing], list[str]]:
    from sparkd.cli.common import config_or_exit
    from sparkd.daemon.views.flightrecords import own_records

    cfg = config_or_exit(obj.config or DEFAULT_CONFIG_PATH, prog="sparkctl")
    own = own_records(cfg, since, None)
    node = node_from_json(own)
    extra: list[dict[str, Any]] = []
    for a, b in _ranges([node], since):
        extra.extend(own_records(cfg, a, b)["records"])
    return cfg.node.name, [node_from_json({**own, "records": extra})], notes


def _cell(r: Record) -> str:
    stamp = time.strftime("%H:%M:%S", time.gmtime(r.wall))
    psi = f"{r.psi_full:5.1f}" if r.psi_full is not None else "    -"
    what = f"{r.state or '?'}{'/' + r.phase if r.phase else ''}"
    running = "-" if r.running is None else str(r.running)
    tps = "-" if r.prompt_tps is None else f"{r.prompt_tps:,.0f}"
    text = (f"    {stamp}  {gib(r.available) if r.available is not None else '?':>9}  {psi}  "
            f"{r.guard_level or '-':<5} {what:<24} {running:>4} {tps:>10}")
    for gpu in r.gpus:
        text += f"\n              {gpu_text(gpu)}"
    for line in (*r.kernel, *r.events):
        text += f"\n              {line[:150]}"
    return text


def gpu_text(gpu: GpuMark) -> str:
    """``GPU 0: 243 W, 100 %, 9.5 of 79.6 GiB``: what the launch's GPU was doing at the record."""
    power = "? W" if gpu.power_w is None else f"{gpu.power_w:.0f} W"
    util = "? %" if gpu.util_pct is None else f"{gpu.util_pct:.0f} %"
    if gpu.used_bytes is None:
        memory = "memory ?"
    elif gpu.total_bytes is None:
        memory = f"{gpu.used_bytes / 2**30:.1f} GiB used"
    else:
        memory = f"{gpu.used_bytes / 2**30:.1f} of {gpu.total_bytes / 2**30:.1f} GiB"
    return f"GPU {gpu.index}: {power}, {util}, {memory}"


def render(report: Report, nodes: list[NodeRing], notes: list[str]) -> str:
    out = [report.headline, ""]
    for f in report.findings:
        out.append(f"{f.label} [{f.cls}]: {f.sentence}")
        if f.evidence:
            out.append("  the records that show it (UTC, MemAvailable, PSI full %, guard, state/phase, running, "
                       "prompt tokens/s):")
            out.extend(_cell(r) for r in f.evidence)
        out.append("")
    clocks = [f"{n.label} {'+' if (report.clocks.get(n.node) or 0) >= 0 else ''}{report.clocks[n.node]:.3f} s"
              for n in nodes if n.node != report.reference and report.clocks.get(n.node) is not None]
    unknown = [n.label for n in nodes if n.node != report.reference and report.clocks.get(n.node) is None]
    if clocks:
        out.append(f"clocks (from the peers' heartbeats, against {report.reference}): {', '.join(clocks)}")
    if unknown:
        out.append(f"clocks taken as in step (no heartbeat measured them): {', '.join(unknown)}")
    out.extend(f"not read: {u}" for u in report.unreadable)
    out.extend(notes)
    return "\n".join(line for line in out).rstrip()


def postmortem(obj: Any, since_text: str | None, local: bool) -> None:
    """``sparkctl postmortem`` (its options: :mod:`sparkd.cli.sparkctl`)."""
    try:
        since = parse_since(since_text, time.time())
    except ValueError as exc:
        click.echo(f"sparkctl postmortem: {exc}", err=True)
        sys.exit(2)
    reference, nodes, notes = _fetch(obj, since, local)
    report = analyse(nodes, reference, since)
    if obj.as_json:
        click.echo(json.dumps({**report.to_json(), "notes": notes}, indent=2))
    else:
        click.echo(render(report, nodes, notes))
