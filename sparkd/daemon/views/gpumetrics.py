"""The GPU families of ``/metrics``: one sample per device of this node's launch, labelled ``gpu`` (NVML's index)
and ``uuid`` beside the node's identity labels. A figure the device does not report (memory on GB10, power on some
boards) is left out of its family, not exported as 0."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from sparkd.host.gpu.model import GpuDevice

# (name, help, how to read it from a device)
FAMILIES: tuple[tuple[str, str, Any], ...] = (
    ("sparkd_gpu_memory_total_bytes", "GPU memory of the device (absent on unified memory: GB10).",
     lambda d: d.total_bytes),
    ("sparkd_gpu_memory_used_bytes", "GPU memory in use on the device.", lambda d: d.used_bytes),
    ("sparkd_gpu_memory_free_bytes", "GPU memory free on the device.", lambda d: d.free_bytes),
    ("sparkd_gpu_power_watts", "Power the device draws.", lambda d: d.power_w),
    ("sparkd_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the device.",
     lambda d: None if d.utilization_pct is None else d.utilization_pct / 100),
    ("sparkd_gpu_temperature_celsius", "The device's temperature.", lambda d: d.temperature_c),
    ("sparkd_gpu_sm_clock_hertz", "The device's SM clock.",
     lambda d: None if d.sm_clock_mhz is None else d.sm_clock_mhz * 1e6),
    ("sparkd_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors since the driver loaded (volatile).",
     lambda d: d.ecc_uncorrected),
    ("sparkd_gpu_compute_processes", "Compute processes on the device.", lambda d: len(d.processes)),
)


def gpu_families(keys: Sequence[str], values: Sequence[str], devices: Sequence[GpuDevice]) -> Iterator[Any]:
    if not devices:
        return
    for name, doc, read in FAMILIES:
        family = GaugeMetricFamily(name, doc, labels=[*keys, "gpu", "uuid"])
        for device in devices:
            value = read(device)
            if value is not None:
                family.add_metric([*values, str(device.index), device.uuid], float(value))
        yield family
