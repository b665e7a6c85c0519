"""The step probe on the GPU host's ranks, read and judged as sparkd's daemon will (issue 38): a thread that reads a
launch's step files every 0.25 s from the moment vLLM (fake_vllm.py's NCCL ranks) is ready, learns the healthy steps'
times, and after the fault notes when and how the rules name the stuck rank, keeping the files of that moment as a
fixture (tests/stepfixture.py) for tests/data/gpu/. Records of processes that are gone are dropped first, as the
daemon will drop them (a SIGKILLed rank's death is its exit's to report, not the probe's)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import stepfixture

from sparkd.host.stepfiles import host_pid, process_state, read_steps
from sparkd.supervisor.stephistory import StepHistory, StepLimits, completed_steps, learn
from sparkd.supervisor.steps import NodeSteps, judge_steps

PERIOD_S = 0.25
LIMITS = StepLimits()  # sparkd's defaults


class ProbeWatch(threading.Thread):
    def __init__(self, folder: Path, node: str, fixture: Path, made: str) -> None:
        super().__init__(daemon=True, name="probe-watch")
        self.folder, self.node, self.fixture, self.made = folder, node, fixture, made
        self.history = StepHistory()
        self.fault_at: float | None = None
        self.result: dict[str, Any] = {"readings": 0, "before_fault": [], "verdict": None}
        self.stopping = threading.Event()

    def fault(self) -> None:
        self.fault_at = time.monotonic()

    def stop(self, timeout: float = 5.0) -> dict[str, Any]:
        """The result, once the watch ended by itself (a verdict, or 30 s after the fault) or ``timeout`` passed."""
        self.join(timeout)
        self.stopping.set()
        self.join(1.0)
        return self.result

    def run(self) -> None:
        while not self.stopping.wait(PERIOD_S):
            if self.fault_at is not None and time.monotonic() - self.fault_at > 30:
                break
            if self._once():
                break

    def _once(self) -> bool:
        files = stepfixture.snapshot(self.folder)
        reading, now = read_steps(self.folder), time.monotonic()
        states, live = {}, []
        for record in reading.records:
            pid = host_pid(record, hint=record.pid)
            state = process_state(pid) if pid else None
            if state is not None and state != "Z":
                live.append(record)
                states[(record.role, record.rank)] = state
        self.result["readings"] += 1
        self.result["steps"] = {f"{r.role}-{r.rank}": [r.step, r.phase] for r in reading.records}
        found = judge_steps([NodeSteps(self.node, reading.read_at_ns, tuple(live), now, states)], self.history, now,
                            LIMITS)
        self.history = learn(self.history, completed_steps(live), LIMITS)
        if found is None:
            return False
        if self.fault_at is None:  # a verdict on a healthy run: a false positive, kept as evidence
            self.result["before_fault"].append(found.failure().sentence)
            return False
        self.result["verdict"] = {"after_fault_s": round(now - self.fault_at, 2), "class": found.cls.value,
                                  "rank": found.view.record.rank, "pid": found.view.record.pid,
                                  "sentence": found.failure().sentence, "history": self.history.to_json()}
        kept = {f"{r.role}-{r.rank}.step" for r in live}  # the files the verdict rests on
        stepfixture.save(self.fixture, {k: v for k, v in files.items() if k in kept}, reading, node=self.node,
                         states=states, history=self.history, verdict=found, made=self.made)
        return True
