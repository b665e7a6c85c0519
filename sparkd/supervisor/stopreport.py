"""What one stop of vLLM did: the grace it was given and why, whether sparkd had to SIGKILL, how long it took, and
whether the GPU memory came back. Shown in the status (``last_stop``), kept with the incident the stop answers
(``stop.json``) and written into vLLM's log, so nobody reads a SIGKILL of sparkd's as one from outside."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sparkd.supervisor.failures import Failure, wedged
from sparkd.supervisor.marks import STOP_LINE


def grace_for(grace_s: float | None, failure: Failure | None, *, drain_s: float, hung_s: float,
              hung: bool = False) -> tuple[float, str]:
    """(the grace, where it comes from): the caller's own (the guard's), else the short one for a wedged vLLM (a
    wedge verdict, or ``hung``: its peer rank died under it), else the drain grace."""
    if grace_s is not None:
        return grace_s, "the stop's own grace"
    if wedged(failure):
        assert failure is not None
        return hung_s, f"hung_stop_grace_s: vLLM was wedged ({failure.cls.value})"
    if hung:
        return hung_s, "hung_stop_grace_s: its peer rank is gone"
    return drain_s, "stop_grace_s"


@dataclass(frozen=True)
class StopReport:
    reason: str
    grace_s: float
    grace_from: str
    seconds: float  # from the SIGTERM to the reaped process
    exit: str  # ExitInfo.describe()
    killed: tuple[int, ...] = ()  # what sparkd SIGKILLed after the grace
    at: float = 0.0  # wall time at the end of the stop
    release: str | None = None  # the GPU memory's release, in words
    released: bool | None = None  # None: not verified (no GPU reading)

    @property
    def sigkilled(self) -> bool:
        return bool(self.killed)

    def sentence(self) -> str:
        how = (f"sparkd sent SIGTERM and, {self.grace_s:g} s later ({self.grace_from}), SIGKILL to PID "
               f"{', '.join(map(str, self.killed))}" if self.killed else
               f"it ended on SIGTERM within the {self.grace_s:g} s grace ({self.grace_from})")
        text = f"stopped ({self.reason}) in {self.seconds:.1f} s: {how}"
        return text + (f"; {self.release}" if self.release else "")

    def log_line(self) -> str:
        """The line written into vLLM's log (``sparkd explain`` reads it: the SIGKILL was sparkd's)."""
        killed = (f"SIGKILL to PID {', '.join(map(str, self.killed))} after {self.grace_s:g} s ({self.grace_from})"
                  if self.killed else "ended on SIGTERM")
        return f"{STOP_LINE}({self.reason}): SIGTERM, {killed}; {self.exit}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "killed": list(self.killed), "sigkilled": self.sigkilled, "sentence": self.sentence()}
