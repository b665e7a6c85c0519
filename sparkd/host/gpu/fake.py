"""An NVML stand-in for tests: the slice of ``pynvml`` that :mod:`sparkd.host.gpu.nvml` calls, fed with devices.

:meth:`FakeNvml.from_view` builds one from a recorded reading (``GpuView.to_json()``: tests/data/gpu/ holds the
real ones from tests/gpu/): a field the reading has as None answers "not supported", as the device did. Devices
and their processes may be changed between reads (a process ends, its memory comes back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sparkd.host.gpu.model import GpuView

NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0

_NAMES = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
          NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_GPU_IS_LOST: "GPU is lost"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, "Unknown Error")


class NVMLError_NotSupported(NVMLError):  # pynvml names it so
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int | None = 85_520_809_984  # None: memory not supported (GB10)
    used: int = 0  # held beyond its processes' (the driver's own)
    processes: dict[int, int | None] = field(default_factory=dict)  # pid → used bytes
    util: tuple[int, int] | None = (0, 0)
    power_mw: int | None = 70_000
    limit_mw: int | None = 700_000
    temperature: int | None = 30
    sm_mhz: int | None = 1980
    mem_mhz: int | None = 2619
    ecc: tuple[int, int] | None = (0, 0)  # (corrected, uncorrected)
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    lost: bool = False  # every query fails with "GPU is lost"


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, devices: list[FakeDevice] | None = None, *, driver: str = "580.159.04",
                 cuda: int = 13000, init_error: int | None = None) -> None:
        self.devices = devices if devices is not None else []
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.inits = 0
        self.calls = 0
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(self, name, value)

    @classmethod
    def from_view(cls, data: Mapping[str, Any]) -> FakeNvml:
        view = GpuView.from_json(data)
        devices = []
        for d in view.devices:
            util = None if d.utilization_pct is None else (int(d.utilization_pct), int(d.memory_utilization_pct or 0))
            devices.append(FakeDevice(
                uuid=d.uuid, name=d.name, total=d.total_bytes,
                used=max(0, (d.used_bytes or 0) - sum(p.used_bytes or 0 for p in d.processes)),
                processes={p.pid: p.used_bytes for p in d.processes}, util=util,
                power_mw=None if d.power_w is None else round(d.power_w * 1000),
                limit_mw=None if d.power_limit_w is None else round(d.power_limit_w * 1000),
                temperature=None if d.temperature_c is None else int(d.temperature_c), sm_mhz=d.sm_clock_mhz,
                mem_mhz=d.mem_clock_mhz,
                ecc=None if d.ecc_uncorrected is None else (d.ecc_corrected or 0, d.ecc_uncorrected),
                remapped=None if d.remapped_rows_pending is None else (0, 0, int(d.remapped_rows_pending), 0)))
        return cls(devices, driver=view.driver or "?", cuda=_cuda_int(view.cuda))

    # ---- the pynvml functions sparkd calls
    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if index >= len(self.devices):
            raise NVMLError(2)
        return self.devices[index]

    def _dev(self, handle: FakeDevice) -> FakeDevice:
        self.calls += 1
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._dev(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._dev(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> Any:
        d = self._dev(handle)
        total = _supported(d.total)
        used = d.used + sum(v or 0 for v in d.processes.values())
        return SimpleNamespace(total=total, used=min(used, total), free=max(0, total - used))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        d = self._dev(handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in sorted(d.processes.items())]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> Any:
        gpu, memory = _supported(self._dev(handle).util)
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        return _supported(self._dev(handle).power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDevice) -> int:
        return _supported(self._dev(handle).limit_mw)

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        return _supported(self._dev(handle).temperature)

    def nvmlDeviceGetClockInfo(self, handle: FakeDevice, clock: int) -> int:
        d = self._dev(handle)
        return _supported(d.sm_mhz if clock == NVML_CLOCK_SM else d.mem_mhz)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDevice, kind: int, counter: int) -> int:
        corrected, uncorrected = _supported(self._dev(handle).ecc)
        return uncorrected if kind == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else corrected

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:
        return _supported(self._dev(handle).remapped)


def _supported(value: Any) -> Any:
    if value is None:
        raise NVMLError_NotSupported()
    return value


def _cuda_int(text: str | None) -> int:
    if not text:
        return 13000
    major, _, minor = text.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def gb10() -> FakeDevice:
    """A DGX Spark's GB10 as NVML answers: memory "not supported" (it is the host's)."""
    return FakeDevice(uuid="GPU-5ad1c0de-0000-4000-8000-00000000gb10", name="NVIDIA GB10", total=None,
                      ecc=None, remapped=None, power_mw=11_000, limit_mw=None)
