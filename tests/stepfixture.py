"""A step-probe fixture: the step files of a real run at the moment sparkd's rules named a process, kept so that the
default suite replays them (tests/unit/test_step_fixtures.py). Made by the real-vLLM tier (tests/realvllm/test_probe.py,
with SPARKD_REALVLLM_KEEP) and the GPU host's runs (tests/gpu/phases.py); the folders live in tests/data/.

A fixture is a folder: the ``*.step`` files as read, and ``reading.json`` — the node's name, the reading's monotonic
time, each process's state letter, the step-time history the rules judged with, and what they said (class, role,
rank, PID, step, sentence), with a line on how the run was made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkd.host.stepfiles import StepReading
from sparkd.supervisor.stephistory import StepHistory
from sparkd.supervisor.steps import StepVerdict


def snapshot(probe_dir: Path) -> dict[str, bytes]:
    """The step files' bytes now: take it right after the reading the verdict came from."""
    return {path.name: path.read_bytes() for path in sorted(probe_dir.glob("*.step"))}


def save(folder: Path, files: dict[str, bytes], reading: StepReading, *, node: str,
         states: dict[tuple[str, int], str], history: StepHistory, verdict: StepVerdict | None, made: str) -> Path:
    """The step files (a :func:`snapshot` taken with ``reading``) and reading.json, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    record: dict[str, Any] = {
        "made": made, "node": node, "read_at_ns": reading.read_at_ns,
        "states": {f"{role}-{rank}": letter for (role, rank), letter in states.items()},
        "history": history.to_json(),
        "expect": None if verdict is None else {
            "class": verdict.cls.value, "role": verdict.view.record.role, "rank": verdict.view.record.rank,
            "pid": verdict.view.record.pid, "step": verdict.step, "sentence": verdict.failure().sentence},
    }
    (folder / "reading.json").write_text(json.dumps(record, indent=2) + "\n")
    return folder


def load(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "reading.json").read_text())
    data["states"] = {(key.split("-")[0], int(key.split("-")[1])): v for key, v in data["states"].items()}
    data["history"] = StepHistory.from_json(data["history"])
    return data


def folders(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("reading.json"))
