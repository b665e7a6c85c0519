"""Power as evidence of a wedge: "the GPUs' power fell while requests were running". Pure.

Field reports say a GB10 whose engine deadlocked draws 16-27 W against ~45 W healthy while utilization reads 95 %
in both: utilization counts a kernel resident, not one making progress; power counts work done. On H100 a rank
spinning in an NCCL collective whose peer died was measured (tests/gpu/README.md) before this was trusted.
:func:`drop` compares the median draw of the busy spell before the wedge with the median since it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RATIO = 0.6  # the draw since the wedge at most this share of the draw before it: a fall
MIN_SAMPLES = 2


@dataclass(frozen=True)
class PowerSample:
    at: float  # monotonic
    watts: float  # summed over the launch's devices
    utilization_pct: float | None = None  # the mean over them


@dataclass(frozen=True)
class PowerDrop:
    before_w: float
    since_w: float
    utilization_pct: float | None

    def text(self) -> str:
        util = f", utilization still {self.utilization_pct:.0f} %" if self.utilization_pct is not None else ""
        return f"GPU power fell from {self.before_w:.0f} W to {self.since_w:.0f} W{util}"


def drop(history: Sequence[PowerSample], since: float, *, window_s: float = 120.0,
         ratio: float = RATIO) -> PowerDrop | None:
    """The fall in draw at ``since`` (the wedge's start): medians of ``window_s`` before it and of what came after."""
    before = [s.watts for s in history if since - window_s <= s.at < since]
    after = [s for s in history if s.at >= since]
    if len(before) < MIN_SAMPLES or len(after) < MIN_SAMPLES:
        return None
    was, now = statistics.median(before), statistics.median(s.watts for s in after)
    if was <= 0 or now > ratio * was:
        return None
    utils = [s.utilization_pct for s in after if s.utilization_pct is not None]
    return PowerDrop(was, now, statistics.mean(utils) if utils else None)
