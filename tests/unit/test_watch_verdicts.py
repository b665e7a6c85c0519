"""A wedge verdict meets vLLM's log: an engine whose death vLLM logged (an outside SIGTERM to the engine core) answers
no canary for the seconds vLLM takes to notice, and that is its death, not a wedge; a wedge with no such line stays
one."""

from __future__ import annotations

from typing import Any

import pytest

from sparkd.config import HealthConfig
from sparkd.daemon.watch.instance import InstanceWatch, Watched
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.health import HealthTracker
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock, FakeProbes, FakeRuntime

SIGTERMED = ["(EngineCore pid=1108) INFO 11-27 09:16:15 [core.py:1454] [shutdown] EngineCore: trigger received "
             "signal=SIGTERM"]
QUIET = ["(APIServer pid=780) INFO 11-27 09:10:23 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s"]


class Reports:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.posted = lines, []  # type: list[str], list[v.Observation]

    def post(self, obs: v.Observation) -> None:
        self.posted.append(obs)

    def state(self) -> State:
        return State.ready

    def on_line(self, line: str, persist: bool = True) -> None:
        pass

    def classify_exit(self, exit_code: int | None, sig: int | None, hint: FailureClass | None,
                      engine_gone: bool = False) -> Failure:
        return classify(exit_code, sig, self.lines, hint=hint)


class Log:
    def info(self, *args: Any, **kwargs: Any) -> None:
        pass


async def verdict(cls: FailureClass, lines: list[str]) -> Failure:
    """What the watch posts when the tracker calls ``cls`` with ``lines`` in vLLM's log."""
    runtime, reports = FakeRuntime(), Reports(lines)
    watch = InstanceWatch(Watched(runtime.start()), runtime, reports, FakeProbes(runtime),  # type: ignore[arg-type]
                          HealthConfig, FakeClock(start=0.0), Log())
    called = Failure(cls=cls, sentence="the tracker's sentence; sparkd restarts.", exit_code=None, signal=None,
                     evidence="canary unanswered")
    watch._observe(lambda t, *_: (t, v.HealthFailed(called)), None)
    (posted,) = reports.posted
    assert isinstance(posted, v.HealthFailed)
    assert isinstance(watch.health, HealthTracker)
    return posted.failure


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [FailureClass.hang, FailureClass.stall])
async def test_a_logged_death_is_no_wedge(cls: FailureClass) -> None:
    failure = await verdict(cls, SIGTERMED)
    assert failure.cls is FailureClass.engine_dead and "received SIGTERM from outside sparkd" in failure.sentence


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [FailureClass.hang, FailureClass.stall])
async def test_a_wedge_without_such_a_line_stays_one(cls: FailureClass) -> None:
    failure = await verdict(cls, QUIET)
    assert failure.cls is cls and failure.sentence.startswith("the tracker's sentence")
