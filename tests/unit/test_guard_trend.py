"""Leak trend: Theil–Sen slope, the downsampled window, and the verdict toward the stop floor. Pure."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from sparkd.config import GuardConfig
from sparkd.guard.sample import GIB, MIB
from sparkd.guard.trend import TrendWindow, add_point, assess, theil_sen

FLOOR = 4 * GIB


def cfg(**overrides: Any) -> GuardConfig:
    return GuardConfig(
        **{
            "trend_window_s": 600.0,
            "trend_step_s": 10.0,
            "trend_min_span_s": 120.0,
            "trend_warn_s": 3600.0,
            **overrides,
        }
    )


def window_of(
    values: Callable[[float], float], *, seconds: float = 600.0, every: float = 1.0, config: GuardConfig | None = None
) -> TrendWindow:
    config = config or cfg()
    w = TrendWindow()
    t = 0.0
    while t <= seconds:
        w = add_point(w, t, int(values(t)), config)
        t += every
    return w


def test_theil_sen_exact_line() -> None:
    """Points on a line give that line."""
    slope, intercept = theil_sen([(x, 100.0 - 2.0 * x) for x in range(10)])
    assert slope == pytest.approx(-2.0) and intercept == pytest.approx(100.0)


def test_theil_sen_ignores_outliers() -> None:
    """A few wild points move a few pairwise slopes, not the median."""
    points = [(float(x), 1000.0 - 5.0 * x) for x in range(30)]
    points[3] = (3.0, 1e6)
    points[17] = (17.0, -1e6)
    points[25] = (25.0, 0.0)
    slope, _ = theil_sen(points)
    assert slope == pytest.approx(-5.0, rel=0.05)


def test_theil_sen_needs_distinct_x() -> None:
    """Two points at the same time say nothing about a slope."""
    with pytest.raises(ValueError):
        theil_sen([(1.0, 2.0), (1.0, 3.0)])


def test_window_downsamples_to_the_step() -> None:
    """Samples closer than trend_step_s to the last kept point are dropped."""
    w = TrendWindow()
    for t in range(26):
        w = add_point(w, float(t), 100, cfg())
    assert [p[0] for p in w.points] == [0.0, 10.0, 20.0]


def test_window_forgets_old_points_and_stays_small() -> None:
    """Only trend_window_s is kept: at most window/step + 1 points, however long the guard runs."""
    w = window_of(lambda t: 100, seconds=5000.0, every=0.5)
    assert w.points[0][0] >= 5000.0 - 600.0
    assert len(w.points) <= 61
    assert w.span_s == pytest.approx(600.0)


@dataclass(frozen=True)
class Case:
    values: Callable[[float], float]
    warn: bool
    plan: bool = False
    seconds: float | None = None  # expected seconds to floor (approx), None: not falling
    config: dict[str, Any] = field(default_factory=dict)


LEAK = lambda t: 20 * GIB - 5 * t * MIB  # noqa: E731  (a leak of 5 MiB/s from 20 GiB)
LEFT = (20 * GIB - 3000 * MIB - FLOOR) / (5 * MIB)  # seconds from the newest point to the floor: ~2677

CASES: dict[str, Case] = {
    "steady leak far from the floor: no warning": Case(
        lambda t: 100 * GIB - t * MIB, warn=False, seconds=(100 * GIB - 600 * MIB - FLOOR) / MIB
    ),
    "steady leak within the warning horizon": Case(LEAK, warn=True, seconds=LEFT),
    "a configured restart horizon asks for a restart": Case(
        LEAK, warn=True, plan=True, seconds=LEFT, config={"trend_restart_s": 20000.0}
    ),
    "restart horizon shorter than the time left: warn only": Case(
        LEAK, warn=True, plan=False, seconds=LEFT, config={"trend_restart_s": 600.0}
    ),
    "no restart unless configured": Case(LEAK, warn=True, plan=False, seconds=LEFT),
    "rising memory: nothing": Case(lambda t: 20 * GIB + t * MIB, warn=False, seconds=None),
    "flat with noise: nothing": Case(lambda t: 20 * GIB + 300 * MIB * math.sin(t * 7.3), warn=False),
    "a one-off drop (a request's burst) is not a leak": Case(
        lambda t: 20 * GIB - (2 * GIB if t > 300 else 0), warn=False
    ),
    "already under the floor: zero seconds": Case(lambda t: 3 * GIB - t * MIB, warn=True, seconds=0.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_assess(name: str) -> None:
    """Each series gives the expected warning, restart request and predicted seconds to the floor."""
    case = CASES[name]
    config = cfg(**case.config)
    verdict = assess(window_of(case.values, config=config), FLOOR, config)
    assert verdict is not None
    assert (verdict.warn, verdict.plan_restart) == (case.warn, case.plan), verdict.reason
    if case.seconds is not None:
        assert verdict.seconds_to_floor == pytest.approx(case.seconds, rel=0.02, abs=1.0)
    elif case.values(600.0) > case.values(0.0):
        assert verdict.seconds_to_floor is None


def test_assess_reason_has_the_numbers() -> None:
    """The sentence gives the rate, the fitted level, the floor and the time left."""
    verdict = assess(window_of(LEAK), FLOOR, cfg())
    assert verdict is not None
    assert "falls 300 MiB/min over 10 min" in verdict.reason
    assert "now ~17.1 GiB: the stop floor 4.0 GiB is 45 min away" in verdict.reason


def test_noisy_leak_slope_is_robust() -> None:
    """A real leak under heavy sample noise and occasional spikes still gives the leak's rate."""
    rng = random.Random(6)

    def noisy(t: float) -> float:
        spike = 3 * GIB if rng.random() < 0.1 else 0
        return 30 * GIB - 2 * MIB * t + rng.gauss(0, 200 * MIB) - spike

    verdict = assess(window_of(noisy), FLOOR, cfg())
    assert verdict is not None
    assert verdict.slope == pytest.approx(-2 * MIB, rel=0.25)


@pytest.mark.parametrize(("seconds", "every"), [(60.0, 1.0), (600.0, 250.0)])
def test_too_little_history_says_nothing(seconds: float, every: float) -> None:
    """Under trend_min_span_s, or fewer than four points: no verdict."""
    assert assess(window_of(LEAK, seconds=seconds, every=every), FLOOR, cfg()) is None
