"""Read the node's GPUs through NVML (``nvidia-ml-py``'s ``pynvml``). Blocking: call it in a worker thread.

Every field is asked on its own: one a device does not support (``NVML_ERROR_NOT_SUPPORTED``: memory on GB10,
power on some boards, ECC on consumer cards) is left None without a word; one that fails otherwise is left None
and named in the device's ``unreadable``. A device whose memory is "not supported" is ``unified`` (GB10). No
``pynvml``, no ``libnvidia-ml.so`` or no driver loaded: a view that says why it was skipped, never an exception.

NVML is started once per reader and kept (its start can take a second on a GPU without persistence mode). The
bindings (~1.9 MiB of a daemon's memory at rest) are imported only once the driver's library loads: a node without an
NVIDIA driver never pays for them.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

from sparkd.host.gpu.model import GpuDevice, GpuProcess, GpuView, skipped

__all__ = ["NvmlReader", "read_view"]

# (field, how it is read) for the plain numeric fields; units become W, °C, MHz, %.
_MILLI = 1000.0


LIBRARY = "libnvidia-ml.so.1"  # what pynvml loads on Linux
NO_DRIVER = "no NVIDIA driver here (libnvidia-ml.so cannot be loaded)"


def _import() -> Any:
    import pynvml

    return pynvml


def _driver_library_loads() -> bool:
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return False
    return True


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    def __init__(self, nvml: Any | None = None, *, wall: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._missing: str | None = None  # pynvml itself cannot be imported: said once, for good
        self._started = False
        self.wall = wall

    def _module(self) -> Any | None:
        if self._nvml is None and self._missing is None:
            if not _driver_library_loads():
                return None  # asked again next time: a driver may load
            try:
                self._nvml = _import()
            except ImportError:
                self._missing = "the NVML bindings are not installed (Python package nvidia-ml-py)"
        return self._nvml

    def _start(self, nvml: Any) -> str | None:
        """Start NVML once; the reason it cannot start, else None (tried again next time: a driver may load)."""
        if self._started:
            return None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                return NO_DRIVER
            if value == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
                return "the NVIDIA driver is not loaded"
            return f"NVML does not start: {exc}"
        except OSError as exc:
            return f"NVML does not start: {exc}"
        self._started = True
        return None

    def read(self) -> GpuView:
        now = self.wall()
        nvml = self._module()
        if nvml is None:
            return skipped(self._missing or NO_DRIVER, now)
        why = self._start(nvml)
        if why is not None:
            return skipped(why, now)
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            return skipped(f"NVML lists no device: {exc}", now)
        cuda = _field(nvml, lambda: nvml.nvmlSystemGetCudaDriverVersion(), [])
        devices = tuple(_device(nvml, i) for i in range(count))
        if not devices:
            return GpuView((), "nvml", driver, _cuda(cuda), now, skipped="NVML sees no GPU on this node")
        return GpuView(devices, "nvml", driver, _cuda(cuda), now)


def _cuda(version: int | None) -> str | None:
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"


def _field(nvml: Any, read: Callable[[], Any], unreadable: list[str], name: str = "") -> Any:
    """``read()``; None when not supported (silently) or when it fails (``name`` noted in ``unreadable``)."""
    try:
        return read()
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_SUPPORTED and name:
            unreadable.append(f"{name}: {exc}")
        return None


def _device(nvml: Any, index: int) -> GpuDevice:
    bad: list[str] = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        return GpuDevice(index, f"index-{index}", unreadable=(f"handle: {exc}",))

    def get(name: str, read: Callable[[], Any]) -> Any:
        return _field(nvml, read, bad, name)

    uuid = get("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle))) or f"index-{index}"
    memory, unified = _memory(nvml, handle, bad)
    util = get("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    power = get("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit = get("power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    remapped = get("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    return GpuDevice(
        index=index, uuid=uuid, name=get("name", lambda: _text(nvml.nvmlDeviceGetName(handle))) or "",
        total_bytes=memory[0], free_bytes=memory[1], used_bytes=memory[2], unified=unified,
        processes=_processes(nvml, handle, bad),
        utilization_pct=None if util is None else float(util.gpu),
        memory_utilization_pct=None if util is None else float(util.memory),
        power_w=None if power is None else power / _MILLI, power_limit_w=None if limit is None else limit / _MILLI,
        temperature_c=_float(get("temperature", lambda: nvml.nvmlDeviceGetTemperature(
            handle, nvml.NVML_TEMPERATURE_GPU))),
        sm_clock_mhz=get("sm_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
        mem_clock_mhz=get("mem_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))),
        ecc_uncorrected=get("ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))),
        ecc_corrected=get("ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC))),
        remapped_rows_pending=None if remapped is None else bool(remapped[2]),
        unreadable=tuple(dict.fromkeys(bad)),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _memory(nvml: Any, handle: Any, bad: list[str]) -> tuple[tuple[int | None, int | None, int | None], bool]:
    """(total, free, used) and whether the device's memory is the host's (NVML: not supported, as on GB10)."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
            return (None, None, None), True
        bad.append(f"memory: {exc}")
        return (None, None, None), False
    return (int(info.total), int(info.free), int(info.used)), False


def _processes(nvml: Any, handle: Any, bad: list[str]) -> tuple[GpuProcess, ...]:
    procs = _field(nvml, lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle), bad, "processes") or []
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), None if used is None or used >= 2**63 else int(used)))
    return tuple(sorted(out, key=lambda p: p.pid))


_DEFAULT = NvmlReader()


def read_view() -> GpuView:
    """The node's GPUs now, through the process-wide reader (blocking)."""
    return _DEFAULT.read()
