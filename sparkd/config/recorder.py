"""The ``[recorder]`` section: the flight recorder (issue 29), the memory settle wait before a start, the restart
gate that says "reboot needed", and the optional hardware watchdog. :mod:`sparkd.config` assembles it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from sparkd.config.container import parse_size
from sparkd.config.sections import _Section

_SIZE = " Bytes, or a size such as `\"4 MiB\"`."
MIN_RING = 64 * 1024  # a smaller ring holds a few minutes at most: no evidence
MAX_RING = 1024**3


class RecorderConfig(_Section):
    """The flight recorder: one compact record a second in a fixed-size ring file on the state disk, each with a
    length and a CRC, made durable by ``fdatasync`` at a bounded rate (``sparkd/recorder/``, docs/design.md)."""

    enabled: bool = Field(default=True, description=(
        "Keep the flight recorder: one record every `interval_s` in the ring file, read by `sparkctl postmortem`."))
    interval_s: float = Field(default=1.0, ge=0.05, le=60, description="Seconds between two records.")
    ring_size: int = Field(default=4 * 1024**2, description=(
        "Size of the ring file; the oldest records are overwritten (4 MiB: about 8 hours at one record a "
        "second)." + _SIZE))
    sync_interval_s: float = Field(default=1.0, ge=0.2, le=60, description=(
        "About one `fdatasync` of the ring in this many seconds (at most one in nine tenths of it): the records a "
        "power cut may lose."))
    path: Path | None = Field(default=None, description=(
        "The ring file; unset: `recorder.ring` in `[paths] state_dir` (keep it on the state disk, not tmpfs)."))
    boot_id_path: Path = Field(default=Path("/proc/sys/kernel/random/boot_id"), description=(
        "Where the boot id is read: every record carries it, so a reboot shows in the ring."))
    settle_band: int = Field(default=1024**3, ge=0, description=(
        "Memory settle before a start: MemAvailable must stay within this band for `settle_s`." + _SIZE))
    settle_s: float = Field(default=3.0, ge=0, description=(
        "Memory settle: how long MemAvailable must stay within `settle_band` (0: no settle wait)."))
    settle_timeout_s: float = Field(default=60.0, ge=0, description=(
        "Memory settle: start anyway after this many seconds (logged; that baseline does not count)."))
    reboot_after_falls: int = Field(default=3, ge=0, description=(
        "Restart gate: stop restarting (\"reboot needed\") after this many consecutive restarts whose settled "
        "post-stop MemAvailable fell by at least `reboot_min_fall` each (0: no gate)."))
    reboot_min_fall: int = Field(default=512 * 1024**2, ge=0, description=(
        "Restart gate: a fall smaller than this is noise, not memory the driver kept." + _SIZE))
    hardware_watchdog: bool = Field(default=False, description=(
        "Arm the hardware watchdog once the ring is synced and pet it from the live loop: a frozen host reboots by "
        "itself with its evidence on disk. Risks: docs/design.md (a killed or hung sparkd reboots the host)."))
    watchdog_device: Path = Field(default=Path("/dev/watchdog"), description="The watchdog device.")
    watchdog_timeout_s: int = Field(default=60, ge=5, le=3600, description=(
        "The watchdog's timeout: a host whose sparkd loop has not petted it for this long reboots."))

    @field_validator("ring_size", "settle_band", "reboot_min_fall", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)

    @field_validator("ring_size")
    @classmethod
    def _ring(cls, value: int) -> int:
        if not MIN_RING <= value <= MAX_RING:
            raise ValueError(f"must be between {MIN_RING // 1024} KiB and {MAX_RING // 1024**2} MiB")
        return value

    @model_validator(mode="after")
    def _watchdog(self) -> RecorderConfig:
        if self.hardware_watchdog and not self.enabled:
            raise ValueError("hardware_watchdog needs the recorder enabled (it is armed once the ring is synced)")
        return self
