"""The unified-memory guard: act before the host freezes (issue 6; README.md in this folder).

One module per concept: the sources (:mod:`.meminfo`, :mod:`.psi`, :mod:`.kmsg`), one observation
(:mod:`.sample`), the adaptive :mod:`.sampler`, the pure :mod:`.policy` and :mod:`.trend`, signalling by
pidfd (:mod:`.kill`) and the loop with the daemon's hooks (:mod:`.guard`).
"""

from sparkd.guard.guard import Guard, GuardCounters, GuardHooks, GuardSignal, guard_failure
from sparkd.guard.policy import Action, Decision, GuardState, Level, decide
from sparkd.guard.sample import Sample
from sparkd.guard.sampler import Sampler, next_interval
from sparkd.guard.trend import TrendVerdict, TrendWindow, add_point, assess, theil_sen

__all__ = [
    "Action", "Decision", "Guard", "GuardCounters", "GuardHooks", "GuardSignal", "GuardState", "Level", "Sample",
    "Sampler", "TrendVerdict", "TrendWindow", "add_point", "assess", "decide", "guard_failure", "next_interval",
    "theil_sen",
]
