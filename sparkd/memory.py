"""A plain reading of /proc/meminfo for status and metrics (the memory guard keeps its own fast sampler)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily

MEMINFO = Path("/proc/meminfo")


def read_meminfo(path: Path = MEMINFO) -> dict[str, int]:
    """meminfo fields in bytes."""
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def driver_residual(m: dict[str, int]) -> int:
    """Memory held outside the kernel's accounting — on GB10 mostly the GPU driver's (DESIGN.md §5)."""
    keys = ("MemFree", "Active", "Inactive", "Slab", "PageTables", "Unevictable")
    return max(0, m.get("MemTotal", 0) - sum(m.get(k, 0) for k in keys))


def memory_metrics(m: dict[str, int]) -> Iterator[Any]:
    if not m:
        return
    for name, key, help_text in (
        ("sparkd_memory_total_bytes", "MemTotal", "MemTotal from /proc/meminfo."),
        ("sparkd_memory_available_bytes", "MemAvailable", "MemAvailable from /proc/meminfo."),
        ("sparkd_memory_free_bytes", "MemFree", "MemFree from /proc/meminfo."),
        ("sparkd_memory_page_cache_bytes", "Cached", "Page cache (Cached) from /proc/meminfo."),
        ("sparkd_memory_shmem_bytes", "Shmem", "Shared memory (Shmem) from /proc/meminfo."),
    ):
        if key in m:
            yield GaugeMetricFamily(name, help_text, value=m[key])
    yield GaugeMetricFamily("sparkd_memory_driver_residual_bytes",
                            "MemTotal - MemFree - Active - Inactive - Slab - PageTables - Unevictable.",
                            value=driver_residual(m))
    if "SwapTotal" in m and "SwapFree" in m:
        yield GaugeMetricFamily("sparkd_memory_swap_used_bytes", "Swap in use.", value=m["SwapTotal"] - m["SwapFree"])
