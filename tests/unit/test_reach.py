"""The head's first step of a start (sparkd/cluster/reach.py) over a scripted peer link and a fake clock: a worker's
sparkd that answers late within ``peer_grace_s`` costs a wait, not a ``peer_lost``; one silent past it is lost.
tests/integration/test_pair.py starts a pair whose head may come up before its worker's sparkd listens."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from structlog.testing import CapturingLogger

from sparkd.cluster.peers import PeerRefused, PeerUnreachable
from sparkd.cluster.reach import reach_workers
from sparkd.testing import FakeClock

pytestmark = pytest.mark.anyio
A, B = "10.0.0.2:8470", "10.0.0.3:8470"


class LateLink:
    """Each peer's sparkd answers from ``up_at`` (fake seconds) on; ``refuses`` answer with a refusal."""

    def __init__(self, clock: FakeClock, up_at: dict[str, float], refuses: frozenset[str] = frozenset()) -> None:
        self.clock, self.up_at, self.refuses = clock, up_at, refuses
        self.asked: list[tuple[str, float]] = []

    @property
    def peers(self) -> list[str]:
        return list(self.up_at)

    async def status(self, peer: str, **kw: Any) -> dict[str, Any]:
        self.asked.append((peer, self.clock.now()))
        if self.clock.now() < self.up_at[peer]:
            raise PeerUnreachable("All connection attempts failed")
        if peer in self.refuses:
            raise PeerRefused("not authorized")
        return {"state": "stopped"}


async def reach(link: LateLink, clock: FakeClock, log: CapturingLogger, grace_s: float = 30,
                phases: list[bool] | None = None) -> Any:
    """The reach's outcome, fake time jumping to each of its polls; ``phases``: what it told of its wait."""
    outcome: list[Any] = []
    told = phases if phases is not None else []

    async def run() -> None:
        outcome.append(await reach_workers(link, link.peers, grace_s=grace_s, poll_s=2,  # type: ignore[arg-type]
                                           clock=clock, log=log, waiting=told.append))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await clock.run_until(lambda: bool(outcome), limit_s=3600)
    return outcome[0]


async def test_a_worker_whose_sparkd_comes_up_within_the_grace_is_waited_for_not_lost() -> None:
    clock, log = FakeClock(), CapturingLogger()
    start = clock.now()
    link, phases = LateLink(clock, {A: start + 7, B: start}), list[bool]()
    assert await reach(link, clock, log, phases=phases) is None
    assert phases == [True, False]  # the status's phase: waiting for the workers, then over
    assert 7 <= clock.now() - start <= 9  # started the poll after the worker's sparkd came up, not at the grace's end
    events = [(c.method_name, c.args[0] if c.args else c.kwargs.get("event")) for c in log.calls]
    assert events == [("warning", "waiting_for_worker"), ("info", "worker_reached")], events
    assert [p for p, _ in link.asked].count(B) == 1  # a peer that answered is not asked again


async def test_a_worker_silent_past_the_grace_is_lost_with_its_reason_and_how_long() -> None:
    clock, log = FakeClock(), CapturingLogger()
    start = clock.now()
    link, phases = LateLink(clock, {A: start, B: start + 3600}), list[bool]()
    failure = await reach(link, clock, log, grace_s=10, phases=phases)
    assert phases == [True, False]
    assert failure is not None and failure.cls.value == "peer_lost"
    assert B in failure.sentence and "All connection attempts failed" in failure.sentence
    assert "silent for 10 s of the 10 s grace" in failure.sentence, failure.sentence
    assert clock.now() - start == pytest.approx(10)


async def test_a_refusal_is_an_answer_and_no_grace_means_no_wait() -> None:
    clock, log = FakeClock(), CapturingLogger()
    start, phases = clock.now(), list[bool]()
    refusing = LateLink(clock, {A: start}, refuses=frozenset({A}))
    assert await reach(refusing, clock, log, grace_s=0, phases=phases) is None
    assert phases == []  # no wait, no phase
    failure = await reach(LateLink(clock, {A: start + 1}), clock, log, grace_s=0)
    assert failure is not None and failure.cls.value == "peer_lost" and "grace" not in failure.sentence
    assert clock.now() == start


def test_sparkctl_wait_says_what_a_start_waits_for_before_vllm_runs() -> None:
    from sparkd.cli.progress import describe_step, live_text

    waiting = {"state": "preflight", "phase": "waiting_for_workers"}
    assert live_text("ready", waiting, 3.0).startswith("preflight: waiting for the workers' sparkd to answer")
    assert describe_step(waiting) == "preflight: waiting for the workers' sparkd to answer"
    settling = live_text("ready", {"state": "preflight", "phase": "memory_settle"}, 3.0)
    assert settling.startswith("preflight: waiting for the memory an earlier start used to come back")
