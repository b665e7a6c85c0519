"""The decisions the shell used to make itself, now pure in the core: a refused launch's class, a wedge seen while
a peer's sparkd is unreachable, and torch's peer-loss lines (one list for the classifier and the instance watch)."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import Failure, FailureClass
from sparkd.supervisor.launchfailure import host_refused, launch_refused
from sparkd.supervisor.logline import clean
from sparkd.supervisor.peerloss import PEER_LOST_MARKERS, names_peer_loss, wedge_or_peer_lost

F = FailureClass

# (unavailable, exit code) -> class, and what the sentence must say
LAUNCHES = [
    (True, None, F.host_unavailable, "The container engine does not answer (boom); sparkd waits for it"),
    (True, 127, F.host_unavailable, "The container engine does not answer"),  # the engine's word wins
    (False, 127, F.config_error, "The launch failed: boom"),
    (False, 126, F.config_error, "The launch failed: boom"),
    (False, 1, F.unknown, "The launch failed: boom"),
    (False, None, F.unknown, "The launch failed: boom"),
    (False, 125, F.unknown, "The launch failed: boom"),
]


@pytest.mark.parametrize(("unavailable", "code", "cls", "says"), LAUNCHES)
def test_a_refused_launch_has_the_class_its_cause_has(unavailable: bool, code: int | None, cls: FailureClass,
                                                       says: str) -> None:
    failure = launch_refused("boom", unavailable=unavailable, exit_code=code)
    assert (failure.cls, failure.exit_code, failure.evidence) == (cls, code, "boom")
    assert failure.sentence.startswith(says)
    assert failure.treatment.restartable is (cls is not F.config_error)


def test_a_host_that_refuses_the_launch_is_a_wait_naming_the_file() -> None:
    failure = host_refused("No space left on device", "/var/lib/sparkd/instance.json", "OSError(28)")
    assert failure.cls is F.host_unavailable
    assert failure.sentence == ("sparkd cannot launch vLLM: No space left on device (/var/lib/sparkd/instance.json); "
                                "it waits and tries again without spending the restart budget.")
    assert "the state directory" in host_refused("Permission denied", None, "x").sentence


WEDGE = {cls: Failure.of(cls, f"a {cls.value} sentence") for cls in F}

# (class seen, peers unreachable) -> class posted
PEERS = [
    (F.hang, ["worker-1"], F.peer_lost),
    (F.stall, ["worker-1", "worker-2"], F.peer_lost),
    (F.hang, [], F.hang),
    (F.stall, [], F.stall),
    (F.engine_dead, ["worker-1"], F.engine_dead),
    (F.killed_by_guard, ["worker-1"], F.killed_by_guard),
    (F.oom, ["worker-1"], F.oom),
]


@pytest.mark.parametrize(("seen", "lost", "posted"), PEERS)
def test_a_wedge_while_a_peer_is_unreachable_is_the_peer_s_loss(seen: FailureClass, lost: list[str],
                                                                posted: FailureClass) -> None:
    failure = wedge_or_peer_lost(WEDGE[seen], lost)
    assert failure.cls is posted
    if posted is seen:
        assert failure is WEDGE[seen]
    else:
        assert failure.evidence == WEDGE[seen].sentence
        assert f"the sparkd of {', '.join(lost)} is unreachable" in failure.sentence


HEADLESS = "[rank1]:[W1212 11:53:07.419998992 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=78): "
LINES = [
    (HEADLESS + "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?",
     True),
    ('[rank2]:[W810 ProcessGroupNCCL.cpp:1826] Failed to check the "should dump" flag on TCPStore, (maybe TCPStore '
     "server has shut down too early), with error: Broken pipe", True),
    ("INFO 01-01 00:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s", False),
    ("(APIServer pid=1) INFO: Connection closed", False),
]


@pytest.mark.parametrize(("line", "lost"), LINES)
def test_the_watch_and_the_classifier_read_the_same_peer_loss_lines(line: str, lost: bool) -> None:
    assert names_peer_loss(clean(line)) is lost
    if lost:  # every marker the watch acts on is one the classifier names as the peer's loss
        assert classify(None, None, [line]).cls is F.peer_lost


def test_every_marker_is_a_peer_loss_to_the_classifier() -> None:
    for marker in PEER_LOST_MARKERS:
        assert classify(None, None, [f"[c10d] recvValue failed: Failed to recv, {marker}"]).cls is F.peer_lost
