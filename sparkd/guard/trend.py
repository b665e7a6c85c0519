"""Leak trend: how fast MemAvailable falls, and when it will reach the stop floor. Pure.

A slow leak (the UCX registration cache: ~14 MB per request) drains the pool over hours and then freezes
the host at whatever moment the floor happens to be crossed, usually mid-request. The guard fits a line
through MemAvailable over ``trend_window_s`` (10 min), one point per ``trend_step_s`` (10 s, so at most
61 points and ~1,800 pairwise slopes, computed once per point), with the Theil–Sen estimator: the median
of all pairwise slopes. A burst of allocations or a freed cache moves a few pairs, not the median.

From the fitted line's value at the newest point and its slope comes the predicted time to the stop
floor. Under ``trend_warn_s`` the guard warns; under ``trend_restart_s`` (when configured) it asks for a
planned restart at the next moment vLLM has no running requests, before the floor forces a stop mid-work.
The window restarts with every vLLM instance (startup allocation is not a leak).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkd.config import GuardConfig
from sparkd.guard.sample import MIB, gib

__all__ = ["TrendVerdict", "TrendWindow", "add_point", "assess", "theil_sen"]

MIN_POINTS = 4  # fewer points than this say nothing about a trend


@dataclass(frozen=True)
class TrendWindow:
    points: tuple[tuple[float, int], ...] = ()  # (monotonic seconds, MemAvailable bytes), oldest first

    @property
    def span_s(self) -> float:
        return self.points[-1][0] - self.points[0][0] if len(self.points) > 1 else 0.0


def add_point(window: TrendWindow, at: float, available: int, cfg: GuardConfig) -> TrendWindow:
    """Downsample: keep a point only every ``trend_step_s``; drop points older than the window."""
    points = window.points
    if points and at - points[-1][0] < cfg.trend_step_s:
        return window
    start = 0
    while start < len(points) and at - points[start][0] > cfg.trend_window_s:
        start += 1
    return TrendWindow((*points[start:], (at, available)))


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the Theil–Sen line through ``points``; the intercept is at x = 0."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    if not slopes:
        raise ValueError("need two points with different x")
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in points)
    return slope, intercept


@dataclass(frozen=True)
class TrendVerdict:
    slope: float  # bytes per second; negative while MemAvailable falls
    fitted: float  # the line's MemAvailable at the newest point, bytes
    seconds_to_floor: float | None  # None: not falling
    warn: bool
    plan_restart: bool
    reason: str


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def assess(window: TrendWindow, floor: int, cfg: GuardConfig) -> TrendVerdict | None:
    """The trend toward ``floor`` (the stop floor), or None while the window is too short to say."""
    points = window.points
    if len(points) < MIN_POINTS or window.span_s < cfg.trend_min_span_s:
        return None
    t0 = points[0][0]
    slope, intercept = theil_sen([(t - t0, float(y)) for t, y in points])
    fitted = intercept + slope * (points[-1][0] - t0)
    rate = f"{abs(slope) * 60 / MIB:.0f} MiB/min over {_duration(window.span_s)}"
    if slope >= 0:
        return TrendVerdict(slope, fitted, None, False, False, f"MemAvailable is not falling (+{rate})")
    seconds = max(0.0, (fitted - floor) / -slope)
    warn = seconds < cfg.trend_warn_s
    plan = cfg.trend_restart_s is not None and seconds < cfg.trend_restart_s
    reason = (f"MemAvailable falls {rate} (Theil–Sen), now ~{gib(fitted)}: the stop floor {gib(floor)} is "
              f"{_duration(seconds)} away")
    return TrendVerdict(slope, fitted, seconds, warn, plan, reason)
