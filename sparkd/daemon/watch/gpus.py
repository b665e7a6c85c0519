"""The launch's GPUs, read every few seconds for the status, the metrics and the evidence of a wedge.

One reading every :data:`INTERVAL_S` (NVML: about a millisecond a device, in a worker thread), the latest kept,
and the launch's summed power draw and mean utilization kept for :data:`KEEP_S` (what ``sparkd.host.gpu.power``
reads when a stall or hang is declared). A node with no driver is read once, said once in the log, and then
left alone; a GB10's "not supported" memory is no problem, only a device without memory figures.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkd.config import Config
from sparkd.host.clock import Clock
from sparkd.host.gpu.model import GpuDevice, GpuView
from sparkd.host.gpu.power import PowerDrop, PowerSample, drop
from sparkd.host.gpu.reading import devices_of_launch, pick
from sparkd.launch.devices import Devices
from sparkd.launch.rehearsal import rehearsal
from sparkd.launch.render import render
from sparkd.supervisor.failures import Failure

if TYPE_CHECKING:
    from sparkd.host.logs import Logger

INTERVAL_S = 5.0
KEEP_S = 600.0
NO_DRIVER = ("no NVIDIA driver", "not installed", "not loaded", "not on PATH")


class LaunchDevices:
    """The GPUs this node's launch uses, from the config now (``sparkd.launch.devices`` decides which). Asked every
    second (the flight recorder's GPU marks) and every reading; the answer is worked out again only for a config it
    has not seen (a reload replaces the config): rendering the launch and its environment each time was a fifth of a
    resting loop's CPU on an H100 host (tests/bench/idle_profile.py)."""

    def __init__(self, config: Callable[[], Config], runtime: str, *, rehearse: bool) -> None:
        self.config = config
        self.runtime = runtime
        self.rehearse = rehearse
        self._known: tuple[Config, Devices] | None = None

    def __call__(self) -> Devices:
        cfg = self.config()
        if self._known is not None and self._known[0] is cfg:
            return self._known[1]
        spec = render(cfg)
        devices = devices_of_launch(cfg, self.runtime, (rehearsal(spec) if self.rehearse else spec).env)
        self._known = (cfg, devices)
        return devices


class GpuSampler:
    def __init__(self, read: Callable[[], Awaitable[GpuView]], clock: Clock, log: Logger, scope: Callable[[], Devices],
                 *, interval_s: float = INTERVAL_S) -> None:
        self.read = read
        self.clock = clock
        self.log = log
        self.scope = scope
        self.interval_s = interval_s
        self.latest: GpuView | None = None
        self.history: deque[PowerSample] = deque(maxlen=int(KEEP_S / interval_s) + 1)
        self.absent = False  # no driver here: not read again

    def launch_devices(self) -> list[GpuDevice]:
        view = self.latest
        return pick(self.scope(), view.devices) if view is not None and view.available else []

    async def sample(self) -> GpuView:
        view = self.latest = await self.read()
        if not view.available:
            return view
        devices = pick(self.scope(), view.devices)
        watts = [d.power_w for d in devices if d.power_w is not None]
        utils = [d.utilization_pct for d in devices if d.utilization_pct is not None]
        if watts:
            self.history.append(PowerSample(self.clock.now(), sum(watts), statistics.mean(utils) if utils else None))
        return view

    async def run(self) -> None:
        first = await self.sample()
        if not first.available:
            self.log.info("gpu_view", skipped=first.skipped)
            if any(mark in (first.skipped or "") for mark in NO_DRIVER):
                self.absent = True
                return
        else:
            self.log.info("gpu_view", source=first.source, driver=first.driver,
                          devices=[f"{d.index} {d.name} {d.uuid}" + (" (unified memory)" if d.unified else "")
                                   for d in first.devices], launch=self.scope().describe())
        while True:
            await self.clock.sleep(self.interval_s)
            await self.sample()

    def power_drop(self, since: float) -> PowerDrop | None:
        return drop(list(self.history), since)

    def annotate(self, failure: Failure, wedged_for_s: float) -> Failure:
        """A hang or stall verdict with the launch's power as evidence: "GPU power fell from 243 W to 121 W,
        utilization still 100 %" when the draw since the wedge began is at most 0.6 of the busy draw before it.
        Evidence, not a verdict of its own (tests/gpu/README.md: an idle H100 at full clock draws what a stuck
        one does)."""
        fell = self.power_drop(self.clock.now() - wedged_for_s)
        if fell is None:
            return failure
        return replace(failure, sentence=failure.sentence.rstrip(".") + f" ({fell.text()}).")

    def incident_evidence(self) -> dict[str, Any] | None:
        """For an incident, once a reading exists on a node that has GPUs."""
        return None if self.latest is None or self.absent else self.evidence()

    def evidence(self) -> dict[str, Any]:
        """For an incident: the latest reading and the power history (monotonic seconds relative to now)."""
        now = self.clock.now()
        return {"view": self.latest.to_json() if self.latest is not None else None,
                "launch": self.scope().describe(),
                "power_history": [{"ago_s": round(now - s.at, 1), "watts": round(s.watts, 1),
                                   "utilization_pct": s.utilization_pct} for s in self.history]}

    def status(self) -> dict[str, Any] | None:
        view = self.latest
        if view is None or (self.absent and not view.available):
            return None if view is None else {"skipped": view.skipped, "devices": []}
        ids = {d.uuid for d in self.launch_devices()}
        return {"source": view.source, "driver": view.driver, "skipped": view.skipped,
                "launch": self.scope().describe(),
                "devices": [{**_short(d), "in_launch": d.uuid in ids} for d in view.devices]}


def _short(d: GpuDevice) -> dict[str, Any]:
    return {"index": d.index, "uuid": d.uuid, "name": d.name, "unified": d.unified, "total_bytes": d.total_bytes,
            "free_bytes": d.free_bytes, "used_bytes": d.used_bytes, "utilization_pct": d.utilization_pct,
            "power_w": d.power_w, "temperature_c": d.temperature_c, "sm_clock_mhz": d.sm_clock_mhz,
            "ecc_uncorrected": d.ecc_uncorrected,
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in d.processes]}
