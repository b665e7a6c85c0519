"""The drain's admission on the real vLLM 0.32 (sparkd_vllm_probe/admit.py): a request vLLM's API server answered 200
before the SIGTERM, still in the engine core's input queue because the engine core was inside a step, is drained
with every token instead of ending empty.

vLLM is started by hand (byhand.py) with the plugin on its PYTHONPATH, ``SPARKD_PROBE_DIR`` and
``SPARKD_DRAIN_ADMIT=1``, as sparkd's launch gives them (tests/unit/test_launch_probe.py): no sparkd here, whose
verdicts would name the held worker a wedge and cut the drain. Its worker is held (SIGSTOP); the second request is
sent once the engine core's step file says it is inside the first request's step. Without the admission the second
stream gets its 200 and then ``[DONE]`` with no token (a recording by hand, 2026-12-08: the engine drained
``count=1`` and the stream ended 1.15 s after the SIGTERM). ``SPARKD_REALVLLM_NO_ADMIT=1`` runs it without the
admission, to see that.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import drainwatch
import pytest
from byhand import SERVED, ByHand, argv, environment
from freeport import free_port
from tier import START_S, UNCOMPILED

from sparkd.host.stepfiles import read_steps
from sparkd.vllm_probe import PLUGIN_DIR

pytestmark = pytest.mark.timeout(600)

TOKENS = 96


@pytest.fixture(scope="module")
def by_hand(realvllm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ByHand]:
    venv, model = realvllm
    folder, port = tmp_path_factory.mktemp("realvllm-admit"), free_port()
    asked = {} if os.environ.get("SPARKD_REALVLLM_NO_ADMIT") == "1" else {"SPARKD_DRAIN_ADMIT": "1"}
    (folder / "probe").mkdir()
    vllm = ByHand(argv(venv, model, port, "--shutdown-timeout", "60", *UNCOMPILED),
                  environment(folder / "cache", PYTHONPATH=str(PLUGIN_DIR), SPARKD_PROBE_DIR=str(folder / "probe"),
                              **asked), folder / "vllm.log", port)
    try:
        yield vllm.start()
    finally:
        vllm.stop()


def engine_in_step(probe: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(r.role == "engine" and r.in_step for r in read_steps(probe).records):
        assert time.monotonic() < deadline, "the engine core never began the first request's step"
        time.sleep(0.01)


def test_a_request_accepted_during_the_last_step_before_the_sigterm_is_drained(by_hand: ByHand) -> None:
    by_hand.serving_after(START_S)
    assert drainwatch.one_request(by_hand.base, SERVED, stream=False, timeout_s=120)["status"] == 200  # compiles
    worker = by_hand.child("Worker")
    assert worker is not None, "vLLM's worker process"
    throttle = drainwatch.Throttle([worker], share=0.0).start()
    throttle.hold()
    streams: list[drainwatch.Stream] = []
    threads = []
    try:
        for first in (True, False):  # the first goes into a step the held worker does not finish; the second waits
            more, started = drainwatch.start_streams(by_hand.base, SERVED, 1, TOKENS)
            streams += more
            threads += started
            drainwatch.wait_answered(more, settle_s=0.0 if first else 0.5)  # the second: on to the engine's queue
            if first:
                engine_in_step(by_hand.log.parent / "probe")
        assert [s.status for s in streams] == [200, 200] and not any(s.chunks for s in streams)
        by_hand.note("SIGTERM")
        at = time.monotonic()
        by_hand.sigterm()
        deadline = time.monotonic() + 30
        while "[shutdown] EngineCore: trigger received" not in by_hand.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the engine core never got its SIGTERM"
            time.sleep(0.05)
    finally:
        throttle.close()
        for thread in threads:
            thread.join(120)
    assert by_hand.wait_exit(120) == 0
    log = by_hand.log.read_text(errors="replace")
    assert all(s.complete for s in streams), json.dumps([s.summary(at) for s in streams]) + "\n" + log[-3000:]
    assert "sparkd drain: took in 1 request(s) accepted before the SIGTERM" in log, log[-3000:]
    assert "draining in-flight requests count=2" in log, log[-3000:]
