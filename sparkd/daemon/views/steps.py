"""The step probe in the status (issue 38): every rank as the probe's watch last read it, and its warning (the probe
turned off in vLLM, or not loaded at all) — ``status["steps"]``, shown by ``sparkctl status``."""

from __future__ import annotations

from typing import Any

from sparkd.supervisor.steps import views
from sparkd.supervisor.stepwatch import StepWatch


def steps_json(watch: StepWatch | None, now: float) -> dict[str, Any] | None:
    """``{"warning", "ranks": [{node, role, rank, pid, step, phase, for_s}]}``; None while the probe is not read."""
    if watch is None:
        return None
    ranks = []
    for v in views(watch.nodes, now):
        r = v.record
        seconds = v.inside_s if r.in_step else v.idle_s
        ranks.append({"node": v.node, "role": r.role, "rank": r.rank, "pid": r.pid, "step": r.step, "phase": r.phase,
                      "for_s": round(seconds, 1) if seconds != float("inf") else None})
    return {"warning": watch.warning, "ranks": ranks}
