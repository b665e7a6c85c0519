"""One observation of the node's memory: what the policy decides on and what metrics export. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.guard.meminfo import MemInfo
from sparkd.guard.psi import Pressure

__all__ = ["GIB", "MIB", "Sample", "gib"]

GIB = 1024**3
MIB = 1024**2


def gib(n: float) -> str:
    """Bytes as a short human figure for reason sentences: ``3.2 GiB``, ``512 MiB``."""
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    mem: MemInfo
    psi: Pressure | None  # None: PSI unavailable
    nvrm_errors: int = 0  # NV_ERR_NO_MEMORY lines seen since the guard started (cumulative)
    vllm_oom_kills: int = 0  # kernel OOM kills of vLLM processes since the guard started (cumulative)

    @property
    def available(self) -> int:
        return self.mem.mem_available

    @property
    def free(self) -> int:
        return self.mem.mem_free

    @property
    def psi_full_avg10(self) -> float | None:
        return None if self.psi is None else self.psi.full_avg10
