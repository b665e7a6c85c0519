"""Before every start: the memory settle wait and the restart gate (the rules: :mod:`sparkd.recorder.baseline`).

:meth:`StartGuard.before_start` runs first in the node's preflight. It samples MemAvailable every
:data:`SAMPLE_S` until it has stayed within ``[recorder] settle_band`` for ``settle_s`` (at most
``settle_timeout_s``; a restart whose memory is back at the last baseline at once), shown as the phase
``memory_settle`` in status and ``sparkctl restart --wait``. The settled value is this start's baseline, kept with
the boot id in ``memory-baselines.json`` (a reboot starts the list over; so does an operator closing the breaker).
When the baselines say memory is not coming back, it returns the ``reboot_needed`` failure: the breaker opens with
"reboot needed: N restarts lost X GiB that was never returned", before the host is at risk.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from sparkd.config import Config
from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.daemon.watch.memory import MemorySampler
from sparkd.guard.sample import gib
from sparkd.host.clock import Clock
from sparkd.host.logs import Logger
from sparkd.state.files import read_json
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.states import State

if TYPE_CHECKING:  # the gate's rules: imported when it first judges (a node with the gate off never does)
    from sparkd.recorder.baseline import Baseline, Verdict

__all__ = ["StartGuard"]

SAMPLE_S = 0.25
KEEP = 32  # baselines kept


def _bytes(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class StartGuard:
    """``note``: an event for the flight recorder's next record; ``post``: the settle's phase to the loop (the node's
    state shows it: status, its history, ``restart --wait``)."""

    def __init__(self, state_dir: Path, memory: MemorySampler, note: Callable[[str], None],
                 post: Callable[[v.Posted], None], files: StateWriter, clock: Clock, log: Logger) -> None:
        self.path = state_dir / "memory-baselines.json"
        self.memory = memory
        self.note = note
        self.post = post
        self.files = files
        self.clock = clock
        self.log = log
        self.baselines: list[Baseline] = self._load()
        self.verdict: Verdict | None = None
        self.last_settle: dict[str, Any] | None = None

    def _load(self) -> list[Baseline]:
        data = read_json(self.path) or {}
        if data.get("boot") != self.memory.boot or not isinstance(data.get("baselines"), list):
            return []
        from sparkd.recorder.baseline import Baseline  # the gate's rules: loaded once there is something to judge

        out = []
        for item in data["baselines"]:
            at, available, residual = (item.get("at"), item.get("available"), item.get("residual")) \
                if isinstance(item, dict) else (None, None, None)
            if isinstance(at, int | float) and _bytes(available):
                out.append(Baseline(float(at), available, residual if _bytes(residual) else None))
        return out[-KEEP:]

    def _save(self) -> None:
        self.files.put(self.path, {"boot": self.memory.boot, "baselines": [
            {"at": b.at, "available": b.available, "residual": b.residual} for b in self.baselines]})

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        """An operator closed the breaker (reset or restart): the gate counts afresh from the next baseline."""
        if before.state is State.failed and after.state is not State.failed and self.baselines:
            self.baselines, self.verdict = [], None
            self._save()
            self.note("memory baselines cleared: the breaker was closed")

    async def before_start(self, cfg: Config) -> Failure | None:
        """Wait for MemAvailable to settle, keep the baseline, and say whether a start is safe (as ``cfg`` says)."""
        rc = cfg.recorder
        if rc.settle_s <= 0 and rc.reboot_after_falls <= 0:
            return None
        value, waited = await self._settle(cfg)
        self.last_settle = {"at": self.clock.wall(), "settled": value is not None, "waited_s": round(waited, 2),
                            "available": value}
        if value is None:
            self.log.warning("memory_not_settled", waited_s=round(waited, 1), band=rc.settle_band)
            self.note(f"memory did not settle within {gib(rc.settle_band)} in {waited:.0f} s; starting "
                               "anyway (no baseline kept)")
            return None
        from sparkd.recorder.baseline import Baseline, reboot_verdict

        self.baselines = [*self.baselines, Baseline(self.clock.wall(), value, self.memory.driver_residual())][-KEEP:]
        self._save()
        self.log.info("memory_settled", available=value, waited_s=round(waited, 2), baselines=len(self.baselines))
        self.note(f"memory settled at {gib(value)} after {waited:.1f} s")
        self.verdict = reboot_verdict(self.baselines, falls=rc.reboot_after_falls, min_fall=rc.reboot_min_fall,
                                      floor=cfg.guard.refuse_start_below)
        if self.verdict is None:
            return None
        self.log.error("reboot_needed", falls=self.verdict.falls, lost=self.verdict.lost,
                       reason=self.verdict.sentence)
        self.note(self.verdict.sentence)
        return Failure.of(FailureClass.reboot_needed, self.verdict.sentence[0].upper() + self.verdict.sentence[1:]
                          + ".", evidence="; ".join(f"{gib(b.available)}" for b in self.baselines[-6:]))

    async def _settle(self, cfg: Config) -> tuple[int | None, float]:
        from sparkd.recorder.baseline import back, settled

        rc = cfg.recorder
        started = self.clock.now()
        last = self.baselines[-1] if self.baselines else None
        self.post(v.Settling("memory_settle"))
        try:
            while True:
                now = self.clock.now()
                self.memory.read()
                samples = list(self.memory.samples)
                value = settled(samples, now, rc.settle_s, rc.settle_band, _cadence(cfg))
                if value is None:  # a restart's memory already back where the last start found it: no wait
                    value = back(samples, last, rc.reboot_min_fall)
                if value is not None or now - started >= rc.settle_timeout_s:
                    return value, now - started
                await self.clock.sleep(SAMPLE_S)
        finally:
            self.post(v.Settling(None))

    # ---- for status and metrics
    def status(self) -> dict[str, Any]:
        return {"baselines": [{"at": b.at, "available": b.available} for b in self.baselines[-8:]],
                "last_settle": self.last_settle,
                "reboot_needed": None if self.verdict is None else self.verdict.sentence}

    @property
    def unreturned(self) -> int:
        """Bytes lost across the current run of falling baselines (0 when the gate is not open)."""
        return self.verdict.lost if self.verdict is not None else 0


def _cadence(cfg: Config) -> float:
    """The longest gap between two samples that still counts as watched: the records' interval while the recorder
    runs, else the settle's own (with slack for a loaded loop)."""
    rc = cfg.recorder
    return 1.5 * max(SAMPLE_S, rc.interval_s if rc.enabled else SAMPLE_S)
