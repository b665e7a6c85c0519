"""Groups beyond the pair: four daemons in four network namespaces on one bridge, each supervising a stand-in
rank, for TP=4 and TP=2 × PP=2 — started workers first, recovering as one unit from every way a rank can go."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import alive
from group_harness import Fabric, Group
from pair_harness import launch_time, stop_a_rank


@pytest.fixture
def make_group(tmp_path: Path) -> Iterator[Any]:
    groups: list[Group] = []

    def make(n: int = 4, **kw: Any) -> Group:
        folder = tmp_path / f"g{len(groups)}"
        folder.mkdir()
        group = Group(folder, Fabric.create(n), **kw)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.close()


def ran_in_parallel(jobs: list[dict[str, Any]]) -> bool:
    """The head's log of one job per worker (its end, and how long it took): every worker's job began before
    the first of them ended. One after the other, each would begin only after the one before it ended."""
    assert len({job["peer"] for job in jobs}) == 3, jobs
    return max(job["at"] - job["duration_s"] for job in jobs) < min(job["at"] for job in jobs)


def flag(cmdline: list[str], name: str, default: str) -> str:
    return cmdline[cmdline.index(name) + 1] if name in cmdline else default


TOPOLOGIES = [pytest.param(4, 1, 2, id="tp4"),  # rank 2: a worker of the one TP group
              pytest.param(2, 2, 3, id="tp2xpp2")]  # rank 3: a worker of the second pipeline stage


@pytest.mark.parametrize(("tp", "pp", "worker_rank"), TOPOLOGIES)
def test_a_group_starts_workers_first_and_recovers_as_one_unit(make_group: Any, tp: int, pp: int,
                                                                worker_rank: int) -> None:
    # A daemon killed and started again must be back before its peers give it up: on a loaded 2-core host a
    # worker's sparkd took 8 s to start, past a 3 s grace (the head then restarted the group under the test).
    group = make_group(tp=tp, pp=pp, peer_grace_s=30).start()
    pids = group.ready()
    for pid in pids:
        cmdline = psutil.Process(pid).cmdline()
        assert (flag(cmdline, "--tensor-parallel-size", "1"), flag(cmdline, "--pipeline-parallel-size", "1")) == (
            str(tp), str(pp)), cmdline
    head_start = launch_time(group.head.status())
    assert all(launch_time(w.status()) < head_start for w in group.workers), "every worker before the head"
    # In parallel: the head asks every worker to start before it sees the first one up (one at a time, each
    # worker would be asked only after the one before it was up). The head's own clock on both ends: a worker's
    # launch time also holds its own scheduling, which a loaded host stretches.
    assert ran_in_parallel(group.head.events("worker_rank_up")[-3:]), "the workers started in parallel"
    assert ran_in_parallel(group.head.events("worker_prepared")[-3:]), "every worker's stop + preflight at once"
    group.one_instance_per_node()
    status = group.head.ctl("status")
    for i in range(1, 4):
        assert f"spark{i}" in status.stdout and f"rank {i}" in status.stdout, status.stdout
    seen_by_worker = group.workers[1].ctl("status").stdout
    assert all(f"spark{i}" in seen_by_worker for i in (0, 1, 3)), seen_by_worker

    launches = 1
    for rank in (worker_rank, 0):  # a worker's rank, then the head's own
        os.kill(pids[rank], signal.SIGKILL)
        launches += 1
        again = group.ready(head_launches=launches)
        assert all(new != old for new, old in zip(again, pids, strict=True)), f"rank {rank} killed: all restarted"
        pids = again

    result = group.workers[2].ctl("restart")  # asked on rank 3's node: the head restarts the whole group
    assert result.returncode == 0 and "by the head" in result.stdout, result.stdout + result.stderr
    again = group.ready(head_launches=launches + 1)
    assert all(new != old for new, old in zip(again, pids, strict=True)), "every rank restarted"
    assert ran_in_parallel(group.head.events("worker_stopped")[-3:]), "the restart stopped the workers at once"
    group.one_instance_per_node()

    group.workers[0].kill()  # rank 1's daemon dies; its rank keeps serving and is adopted
    group.workers[0].start()
    assert group.ready(head_launches=launches + 1) == again
    group.head.kill()
    group.head.start()
    assert group.ready(head_launches=0) == again, "a restarted head adopts its rank; the group keeps serving"


def test_a_frozen_rank_is_named_and_the_group_restarts(make_group: Any) -> None:
    """Rank 3 of a TP=4 group stops (SIGSTOP): the head reads every node's step records over the peer link and names
    the rank, its node, PID and step within 15 s, before any canary timeout (30 s)."""
    group = make_group(tp=4, health={"canary_interval_s": 1, "canary_timeout_s": 30, "busy_grace_s": 600}).start()
    pids = group.ready()
    rank, failure, took, frozen = stop_a_rank(group.head, group.workers[2], pids[3])
    assert rank.rank == 3 and rank.world_size == 4 and failure["class"] == "hang", failure
    assert failure["message"].startswith(f"rank 3 (worker) on spark3, PID {rank.pid}, stopped (SIGSTOP) has not "
                                         "begun step "), failure
    assert took <= 15, (took, failure)
    again = group.ready(head_launches=2, timeout=180)
    assert again[3] != pids[3] and alive(frozen) == [], "the frozen rank was ended, not left behind"


def test_a_lost_node_is_waited_for_and_the_group_comes_back(make_group: Any) -> None:
    # The canary's timeout above the peer link's (5 s), as in the shipped defaults (30 s): the loss is seen as
    # the peer's, not as a hang of this rank.
    group = make_group(tp=4, health={"canary_timeout_s": 10}).start()
    pids = group.ready()
    group.fabric.cut(2)
    group.workers[1].wait_for(lambda s: s.get("pid") is None, 60, "the cut-off worker stops its rank")
    head = group.head.wait_for(lambda s: s.get("state") == "backoff", 60, "the head waits for the lost node")
    assert head["last_failure"]["class"] == "peer_lost" and not head["breaker"]["open"]
    group.fabric.restore(2)
    again = group.ready(head_launches=2, timeout=180)
    assert all(new != old for new, old in zip(again, pids, strict=True))
    group.one_instance_per_node()


def test_ranks_that_cannot_form_a_group_are_refused_naming_them(make_group: Any) -> None:
    group = make_group(tp=4, ranks=[0, 1, 1, 3]).start()
    status = group.head.wait_state("failed", timeout=60)
    message = status["last_failure"]["message"]
    assert "rank 1 is claimed 2 times" in message and "spark1" in message and "spark2" in message
    assert all(w.status().get("pid") is None for w in group.workers)
