"""One reading of the node's GPUs: pure data, JSON both ways (status, incidents, fixtures).

A field a device does not expose (power on some boards, ECC on consumer cards, memory on GB10) is None, never
an error. ``unified``: the device answers "not supported" for its own memory (GB10: its memory is the host's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1 << 30
WEDGED = "the GPU did not answer"  # how a reading that timed out begins (a wedged GPU or driver)


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a device: its host PID and the device memory it holds (None: not reported)."""

    pid: int
    used_bytes: int | None = None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str = ""
    total_bytes: int | None = None  # None: not supported (unified memory) or unreadable
    free_bytes: int | None = None
    used_bytes: int | None = None
    unified: bool = False  # device memory "not supported": the host's memory is the GPU's (GB10)
    processes: tuple[GpuProcess, ...] = ()
    utilization_pct: float | None = None  # the share of the last sample period a kernel ran
    memory_utilization_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    ecc_uncorrected: int | None = None  # volatile (since the driver loaded)
    ecc_corrected: int | None = None
    remapped_rows_pending: bool | None = None  # a row remap waits for a GPU reset
    unreadable: tuple[str, ...] = ()  # fields whose query failed with an error other than "not supported"

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.name})" if self.name else "")

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["processes"] = [asdict(p) for p in self.processes]
        out["unreadable"] = list(self.unreadable)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuDevice:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["processes"] = tuple(GpuProcess(int(p["pid"]), p.get("used_bytes"))
                                   for p in data.get("processes") or [])
        known["unreadable"] = tuple(data.get("unreadable") or ())
        return cls(**known)


@dataclass(frozen=True)
class GpuView:
    """Every device of the node at ``at`` (wall time), or why there is none (``skipped``)."""

    devices: tuple[GpuDevice, ...] = ()
    source: str = "nvml"  # nvml | nvidia-smi | none
    driver: str | None = None
    cuda: str | None = None  # the CUDA version the driver supports, e.g. 13.0
    at: float = 0.0
    skipped: str | None = None  # no NVML library, no driver, no device: said in words
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def available(self) -> bool:
        return self.skipped is None

    def device(self, key: str | int) -> GpuDevice | None:
        for d in self.devices:
            if key in (d.index, str(d.index), d.uuid) or (isinstance(key, str) and key.startswith("GPU-")
                                                          and d.uuid.startswith(key)):
                return d
        return None

    def holders(self) -> dict[int, list[GpuDevice]]:
        """PID → the devices it holds memory on."""
        out: dict[int, list[GpuDevice]] = {}
        for d in self.devices:
            for p in d.processes:
                out.setdefault(p.pid, []).append(d)
        return out

    def only(self, devices: Sequence[GpuDevice]) -> GpuView:
        return GpuView(tuple(devices), self.source, self.driver, self.cuda, self.at, self.skipped, self.notes)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "driver": self.driver, "cuda": self.cuda, "at": self.at,
                "skipped": self.skipped, "notes": list(self.notes), "devices": [d.to_json() for d in self.devices]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuView:
        return cls(tuple(GpuDevice.from_json(d) for d in data.get("devices") or []), str(data.get("source", "nvml")),
                   data.get("driver"), data.get("cuda"), float(data.get("at") or 0.0), data.get("skipped"),
                   tuple(data.get("notes") or ()))


def skipped(why: str, at: float = 0.0) -> GpuView:
    return GpuView(source="none", at=at, skipped=why)
