"""What one stop of vLLM did: the grace it was given and why (``sparkd.supervisor.graces.plan_for``), how its drain
went, whether sparkd had to SIGKILL, how long it took, and whether the GPU memory came back. Shown in the status
(``last_stop``), kept with the incident the stop answers (``stop.json``) and written into vLLM's log, so nobody reads
a SIGKILL of sparkd's as one from outside."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sparkd.supervisor.marks import STOP_LINE


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
    kind: str | None = None  # the plan's kind: drain, now, guard, hung, failure, loading (graces.StopKind)
    drain: str | None = None  # how the drain went, in words ("drained in 12.3 s"); None: vLLM did not drain
    cut: str | None = None  # why sparkd ended the tree before the grace was out (the drain cut short)

    @property
    def sigkilled(self) -> bool:
        return bool(self.killed)

    def sentence(self) -> str:
        pids = ", ".join(map(str, self.killed))
        how = (f"sparkd sent SIGTERM and cut it short with SIGKILL to PID {pids} ({self.cut})" if self.killed and
               self.cut else f"sparkd sent SIGTERM and, {self.grace_s:g} s later ({self.grace_from}), SIGKILL to PID "
               f"{pids}" if self.killed else
               f"it ended on SIGTERM within the {self.grace_s:g} s grace ({self.grace_from})")
        text = f"stopped ({self.reason}) in {self.seconds:.1f} s: {how}"
        text += f"; {self.drain}" if self.drain else ""
        return text + (f"; {self.release}" if self.release else "")

    def log_line(self) -> str:
        """The line written into vLLM's log (``sparkd explain`` reads it: the SIGKILL was sparkd's)."""
        pids = ", ".join(map(str, self.killed))
        killed = (f"SIGKILL to PID {pids}, cut short ({self.cut})" if self.killed and self.cut else
                  f"SIGKILL to PID {pids} after {self.grace_s:g} s ({self.grace_from})" if self.killed else
                  "ended on SIGTERM")
        return f"{STOP_LINE}({self.reason}): SIGTERM, {killed}; {self.exit}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "killed": list(self.killed), "sigkilled": self.sigkilled, "sentence": self.sentence()}
