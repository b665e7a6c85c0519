"""``nvidia-smi``: the fallback reading when NVML cannot be had from Python, and the evidence format.

Two CSV queries (``--format=csv,noheader,nounits``) make a :class:`~sparkd.host.gpu.model.GpuView`: the devices
(:data:`GPU_FIELDS`) and the compute processes (:data:`APP_FIELDS`, joined to their device by UUID). A value
``[N/A]`` or ``[Not Supported]`` is None; a device whose memory is not reported is ``unified`` (GB10).
``nvidia-smi -q`` (every field, as text) goes into incident folders. The parsers are pure; the runs are async
and bounded (nvidia-smi hangs on a wedged GPU).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import anyio

from sparkd.host.gpu.model import WEDGED, GpuDevice, GpuProcess, GpuView, skipped

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu",
              "utilization.memory", "power.draw", "power.limit", "temperature.gpu", "clocks.sm", "clocks.mem",
              "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total")
APP_FIELDS = ("pid", "gpu_uuid", "used_memory")
QUERY_GPU = (f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
QUERY_APPS = (f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits")
TIMEOUT_S = 30.0
MIB = 1 << 20


def _value(text: str) -> str | None:
    text = text.strip()
    return None if not text or text.startswith("[") or text in ("N/A", "Not Supported") else text


def _number(text: str) -> float | None:
    value = _value(text)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _int(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _mib(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(value * MIB)


def parse_apps(text: str) -> dict[str, list[GpuProcess]]:
    """``pid, gpu_uuid, used_memory`` lines → processes by device UUID (a line that is not one is skipped)."""
    out: dict[str, list[GpuProcess]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(APP_FIELDS) or not parts[0].isdigit():
            continue
        out.setdefault(parts[1], []).append(GpuProcess(int(parts[0]), _mib(parts[2])))
    return out


def parse_gpus(text: str, apps: dict[str, list[GpuProcess]] | None = None) -> list[GpuDevice]:
    """One device per CSV line of :data:`GPU_FIELDS`."""
    devices = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(GPU_FIELDS) or not parts[0].isdigit():
            continue
        row = dict(zip(GPU_FIELDS, parts, strict=True))
        total = _mib(row["memory.total"])
        uuid = row["uuid"]
        devices.append(GpuDevice(
            index=int(row["index"]), uuid=uuid, name=row["name"], total_bytes=total,
            used_bytes=_mib(row["memory.used"]), free_bytes=_mib(row["memory.free"]), unified=total is None,
            processes=tuple(sorted((apps or {}).get(uuid, []), key=lambda p: p.pid)),
            utilization_pct=_number(row["utilization.gpu"]), memory_utilization_pct=_number(row["utilization.memory"]),
            power_w=_number(row["power.draw"]), power_limit_w=_number(row["power.limit"]),
            temperature_c=_number(row["temperature.gpu"]), sm_clock_mhz=_int(row["clocks.sm"]),
            mem_clock_mhz=_int(row["clocks.mem"]), ecc_uncorrected=_int(row["ecc.errors.uncorrected.volatile.total"]),
            ecc_corrected=_int(row["ecc.errors.corrected.volatile.total"])))
    return devices


async def run_smi(args: Sequence[str], timeout_s: float = TIMEOUT_S) -> tuple[int, str] | str:
    """(exit status, stdout) of ``nvidia-smi args``, or why it could not be had (a sentence)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi is not on PATH (no NVIDIA driver here)"
    try:
        with anyio.fail_after(timeout_s):
            result = await anyio.run_process([smi, *args], check=False)
    except TimeoutError:
        return f"{WEDGED} within {timeout_s:.0f} s (nvidia-smi): the GPU or its driver is wedged"
    except OSError as exc:
        return f"cannot run nvidia-smi: {exc}"
    return result.returncode, result.stdout.decode(errors="replace")


async def read_view_smi(wall: float = 0.0) -> GpuView:
    gpus = await run_smi(QUERY_GPU)
    if isinstance(gpus, str):
        return skipped(gpus, wall)
    code, text = gpus
    if code != 0:
        return skipped(f"nvidia-smi exited with {code}: {text.strip().splitlines()[-1:] or 'no output'}", wall)
    apps = await run_smi(QUERY_APPS)
    listed = parse_apps(apps[1]) if not isinstance(apps, str) and apps[0] == 0 else {}
    devices = parse_gpus(text, listed)
    if not devices:
        return GpuView((), "nvidia-smi", at=wall, skipped="nvidia-smi lists no GPU")
    return GpuView(tuple(devices), "nvidia-smi", at=wall)


async def query_text(timeout_s: float = TIMEOUT_S) -> str | None:
    """``nvidia-smi -q``: every field of every GPU as text, for an incident folder; None without nvidia-smi."""
    result = await run_smi(["-q"], timeout_s)
    if isinstance(result, str):
        return None if "not on PATH" in result else result + "\n"
    return result[1]
