"""The progress of a drain read from vLLM's log and gauges (sparkd.supervisor.drainlog): ``draining: N in flight,
T s left``, then drained, aborted or given up. Table-tested on vLLM 0.32's own lines; the whole recorded drain of the
real vLLM is replayed at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.supervisor.drainlog import Drain, DrainState, advance, begin, counted

API = "(APIServer pid=7) INFO 12-06 05:10:00 [launcher.py:270] "
CORE = "(EngineCore pid=9) INFO 12-06 05:10:00 [core.py:1635] "
STOPPING = API + "[shutdown] API server: stopping engine client mode=drain timeout=60s"
START = CORE + "[shutdown] EngineCore: start mode=drain timeout=60s"
DRAINING = CORE + "[shutdown] EngineCore: draining in-flight requests count=3 timeout=60s"
COMPLETE = CORE + "[shutdown] EngineCore: request processing complete; starting resource teardown"
FORCE = ("(APIServer pid=7) WARNING 12-06 05:11:00 [utils.py:648] [shutdown] Process manager: force killing "
         "remaining processes count=1")
ABORT_START = API + "[shutdown] API server: stopping engine client mode=abort timeout=0s"
ABORTING = CORE + "[shutdown] EngineCore: aborting in-flight requests count=2"
WAITING = "INFO:     Waiting for connections to close. (CTRL+C to force quit)"
THROUGHPUT = ("(APIServer pid=7) INFO 12-06 05:10:10 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 "
              "tokens/s, Avg generation throughput: 40.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache "
              "usage: 0.1%, Prefix cache hit rate: 0.0%")


def fold(lines: list[tuple[float, str]], drain: Drain | None = None) -> Drain | None:
    for at, line in lines:
        drain = advance(drain, line, at)
    return drain


@pytest.mark.parametrize(("lines", "now", "state", "in_flight", "sentence"), [
    ([(100, STOPPING)], 103, DrainState.draining, None, "draining: the count in flight not read yet, 57 s left"),
    ([(100, STOPPING), (100.5, START), (100.5, DRAINING)], 110, DrainState.draining, 3,
     "draining: 3 in flight, 50 s left"),
    ([(100, STOPPING), (100.5, DRAINING), (110, THROUGHPUT)], 111, DrainState.draining, 1,
     "draining: 1 in flight, 49 s left"),
    ([(100, STOPPING), (100.5, DRAINING), (112.3, COMPLETE)], 113, DrainState.drained, 0, "drained in 12.3 s"),
    ([(100, STOPPING), (100.5, DRAINING), (160.2, FORCE)], 161, DrainState.gave_up, 3,
     "gave up after 60.2 s with 3 requests in flight (the 60 s drain ran out)"),
    ([(100, STOPPING), (100.5, DRAINING), (112, COMPLETE), (160.2, FORCE)], 161, DrainState.drained, 0,
     "drained in 12.0 s"),
    ([(100, ABORT_START), (100.1, FORCE), (100.2, ABORTING)], 101, DrainState.aborted, 0, "aborted 2 requests"),
    ([(100, ABORT_START), (100.1, FORCE)], 101, DrainState.aborted, 0, "aborted the requests in flight"),
    ([(100, ABORT_START), (100.2, ABORTING), (100.3, COMPLETE)], 101, DrainState.aborted, 0, "aborted 2 requests"),
    ([(100, ABORT_START), (100.3, COMPLETE)], 101, DrainState.aborted, 0, "aborted the requests in flight"),
    ([(100, ABORT_START), (100.1, FORCE), (100.5, WAITING)], 130, DrainState.stranded, 0,
     "stranded after 0.1 s: the engine is gone and its clients still wait"),
    ([(100, ABORT_START), (100.1, FORCE), (100.2, ABORTING), (100.5, WAITING)], 130, DrainState.stranded, 0,
     "stranded after 0.1 s: the engine is gone and the clients of 2 requests still wait"),
    ([(100, STOPPING), (100.5, DRAINING), (160.2, FORCE), (161, WAITING)], 170, DrainState.stranded, 3,
     "stranded after 60.2 s: the engine is gone and the clients of 3 requests still wait"),
    ([(100, STOPPING), (100.5, DRAINING), (112, COMPLETE), (113, WAITING)], 120, DrainState.drained, 0,
     "drained in 12.0 s"),
])
def test_a_drain_read_from_the_log(lines: list[tuple[float, str]], now: float, state: DrainState,
                                   in_flight: int | None, sentence: str) -> None:
    drain = fold(lines)
    assert drain is not None
    assert (drain.state, drain.in_flight, drain.sentence(now)) == (state, in_flight, sentence)


def test_no_shutdown_line_is_no_drain_and_changes_nothing() -> None:
    assert fold([(1, THROUGHPUT), (2, COMPLETE.replace("[shutdown] ", ""))]) is None
    drain = begin(5.0, 60)
    assert advance(drain, "(APIServer pid=7) INFO 12-06 05:10:00 [x.py:1] anything", 6.0) is drain


def test_sparkds_sigterm_starts_the_clock_and_vllms_own_timeout_replaces_the_launchs() -> None:
    drain = begin(100.0, 120)
    assert drain.sentence(130.0) == "draining: the count in flight not read yet, 90 s left"
    later = fold([(101, STOPPING), (101.5, DRAINING)], drain)
    assert later is not None and later.started_at == 100.0, "the clock started at the SIGTERM"
    assert later.timeout_s == 60.0 and later.sentence(110.0) == "draining: 3 in flight, 50 s left"
    assert begin(100.0, 0).mode == "abort"


def test_the_gauges_count_down_never_up() -> None:
    drain = fold([(100, STOPPING), (100.5, DRAINING)])
    assert drain is not None
    fewer = counted(drain, 1.0, 0.0)
    assert fewer is not None and fewer.in_flight == 1
    assert counted(fewer, 2.0, 1.0) is fewer, "a refused newcomer is no request in flight"
    assert counted(fewer, None, None) is fewer, "no gauge page: nothing known"
    done = advance(fewer, COMPLETE, 110)
    assert counted(done, 4.0, 0.0) is done, "after the drain the gauges say nothing about it"
    unknown = counted(begin(0.0, 60), 2.0, 1.0)
    assert unknown is not None and unknown.in_flight == 3


def test_a_heads_workers_may_stop_once_its_engine_is_done_with_the_requests() -> None:
    draining = fold([(100, STOPPING), (100.5, DRAINING)])
    assert draining is not None and not draining.requests_done
    for end in (COMPLETE, FORCE):
        done = advance(draining, end, 110)
        assert done is not None and done.requests_done


def test_time_left_never_goes_below_zero_and_the_json_says_all() -> None:
    drain = fold([(100, STOPPING), (100.5, DRAINING)])
    assert drain is not None and drain.left_s(500.0) == 0.0
    assert drain.to_json(110.0) == {"state": "draining", "mode": "drain", "in_flight": 3, "in_flight_at_start": 3,
                                    "timeout_s": 60.0, "left_s": 50.0, "sentence": "draining: 3 in flight, 50 s left"}


CORPUS = Path(__file__).resolve().parents[1] / "data" / "vllm-logs"


def replay(name: str) -> Drain | None:
    """A recorded log of the real vLLM 0.32 (tests/realvllm/record_drain.py), a second per line."""
    body = (CORPUS / f"{name}.log").read_text(encoding="utf-8").partition("\n---\n")[2]
    drain: Drain | None = None
    for at, line in enumerate(body.splitlines()):
        drain = advance(drain, line, float(at))
    return drain


@pytest.mark.parametrize(("name", "state", "at_start"), [
    ("realvllm-032-drain", DrainState.drained, 4),
    ("realvllm-032-drain-abort", DrainState.stranded, None),
    ("realvllm-032-drain-deadline", DrainState.stranded, 4),
    ("realvllm-032-drain-cut", DrainState.stranded, 4),
])
def test_the_real_vllms_recorded_stops(name: str, state: DrainState, at_start: int | None) -> None:
    drain = replay(name)
    assert drain is not None and drain.state is state, drain
    assert drain.in_flight_at_start == at_start
