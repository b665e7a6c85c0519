"""The pair as one unit: two daemons in two network namespaces, each supervising a stand-in rank coupled
through the master port, recovering together from every way one side can go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemon_harness import alive, kill_tree, tree
from pair_harness import launch_time, stop_a_rank


def test_cold_start_starts_the_worker_before_the_head(make_pair: Any) -> None:
    pair = make_pair().start()
    pair.ready()
    assert launch_time(pair.worker.status()) < launch_time(pair.head.status())
    pair.one_instance_per_node()
    pair.head.wait_for(lambda s: s["peers"][0]["reachable"] and s["peers"][0]["state"] == "ready", 10,
                       "the head sees its worker ready")


def test_killing_the_worker_rank_restarts_the_pair(make_pair: Any) -> None:
    pair = make_pair().start()
    head_pid, worker_pid = pair.ready()
    os.kill(worker_pid, signal.SIGKILL)
    new_head, new_worker = pair.ready(head_launches=2)
    assert new_head != head_pid and new_worker != worker_pid
    pair.one_instance_per_node()
    failure = pair.head.status()["last_failure"]
    assert pair.worker.config["node"]["address"] in failure["message"], failure


def test_killing_the_head_rank_restarts_the_pair(make_pair: Any) -> None:
    pair = make_pair().start()
    head_pid, worker_pid = pair.ready()
    os.kill(head_pid, signal.SIGKILL)
    new_head, new_worker = pair.ready(head_launches=2)
    assert new_head != head_pid and new_worker != worker_pid
    pair.one_instance_per_node()


def test_a_hung_worker_rank_is_named_by_the_head_and_the_pair_restarts(make_pair: Any) -> None:
    """The worker's rank stops (SIGSTOP): the head reads every rank's step records (its own, and the worker's over the
    peer link) and names the rank, its node, PID and step within 15 s — long before the canary's timeout (30 s)."""
    pair = make_pair(health={"canary_interval_s": 1, "canary_timeout_s": 30, "busy_grace_s": 600}).start()
    _head_pid, worker_pid = pair.ready()
    rank, failure, took, frozen = stop_a_rank(pair.head, pair.worker, worker_pid)
    assert rank.rank == 1 and rank.world_size == 2 and failure["class"] == "hang", failure
    assert failure["message"].startswith(f"rank 1 (worker) on worker, PID {rank.pid}, stopped (SIGSTOP) has not begun "
                                         "step "), failure
    assert took <= 15, (took, failure)
    _new_head, new_worker = pair.ready(head_launches=2, timeout=120)
    assert new_worker != worker_pid
    assert alive(frozen) == [], "the frozen rank was killed, not left behind"


def test_cutting_the_link_stops_both_ranks_and_the_pair_recovers_when_it_returns(make_pair: Any) -> None:
    # The head's engine blocks on the lost rank, so its canary would call an idle-engine hang after
    # canary_timeout_s; the default (30 s) is not shorter than peer_grace_s (30 s), and neither is it here.
    pair = make_pair(health={"canary_timeout_s": 10}).start()
    head_pid, worker_pid = pair.ready()
    pair.link.cut()
    pair.worker.wait_for(lambda s: s.get("state") in ("stopped", "failed") and s.get("pid") is None, 60,
                         "the worker stops its rank without its head")
    head = pair.head.wait_for(lambda s: s.get("state") == "backoff", 60, "the head waits for its worker")
    assert head["last_failure"]["class"] == "peer_lost"
    assert not head["breaker"]["open"]
    pair.link.restore()
    new_head, new_worker = pair.ready(head_launches=2, timeout=120)
    assert new_head != head_pid and new_worker != worker_pid
    pair.one_instance_per_node()


def test_a_worker_node_reboot_leads_back_to_a_clean_pair(make_pair: Any) -> None:
    pair = make_pair().start()
    _, worker_pid = pair.ready()
    rank = tree(worker_pid)
    pair.worker.kill()
    kill_tree(rank)
    pair.head.wait_for(lambda s: s.get("state") == "backoff", 60, "the head notices the worker is gone")
    pair.worker.start()
    pair.ready(head_launches=2, timeout=120)
    pair.one_instance_per_node()


def test_a_head_reboot_clears_the_stale_worker_rank(make_pair: Any) -> None:
    pair = make_pair().start()
    head_pid, worker_pid = pair.ready()
    rank = tree(head_pid)
    pair.head.kill()
    kill_tree(rank)
    pair.head.start()
    _, new_worker = pair.ready(head_launches=1, timeout=120)
    assert new_worker != worker_pid, "the stale worker rank from before the reboot was replaced"
    pair.one_instance_per_node()


def test_mismatched_launch_settings_are_refused_naming_the_difference(make_pair: Any) -> None:
    pair = make_pair(worker_launch={"max_model_len": 4096}).start()
    status = pair.head.wait_state("failed", timeout=60)
    message = status["last_failure"]["message"]
    assert "max_model_len is 8192 here but 4096 on" in message
    assert pair.worker.status()["pid"] is None


def test_sparkctl_on_the_worker_acts_on_the_whole_pair(make_pair: Any) -> None:
    pair = make_pair().start()
    head_pid, worker_pid = pair.ready()
    result = pair.worker.ctl("restart")
    assert result.returncode == 0 and "by the head" in result.stdout, result.stdout + result.stderr
    new_head, new_worker = pair.ready(head_launches=2)
    assert new_head != head_pid and new_worker != worker_pid
    local = pair.worker.ctl("stop", "--local")
    assert "acts on this node's rank alone" in local.stderr


STREAMS = """\
import json, sys
sys.path.insert(0, sys.argv[1])
import drainwatch
streams, threads = drainwatch.start_streams("http://127.0.0.1:8000", "test-model", 2, int(sys.argv[2]))
drainwatch.wait_begun(streams)
print("begun", flush=True)
for thread in threads:
    thread.join(120)
print(json.dumps([s.summary(0.0) | {"complete": s.complete} for s in streams]), flush=True)
"""


def test_a_restart_drains_the_heads_requests_before_the_worker_rank_stops(make_pair: Any, tmp_path: Any) -> None:
    """vLLM 0.32's drain (the stand-in's, held to the real one): the head's API server drains its streams while the
    worker's rank runs on (a worker stopped first turns every request in flight into an NCCL error); only then the
    worker's rank is stopped, and the group restarts with its every-rank-stopped proof as before."""
    env = {"SPARKD_STANDIN_VLLM_VERSION": "0.32.0", "SPARKD_STANDIN_TOKENS_PER_S": "40"}
    pair = make_pair(launch={"env": env}, stop={"drain_s": 60}).start()
    head_pid, worker_pid = pair.ready()
    script = tmp_path / "streams.py"
    script.write_text(STREAMS)
    tests = str(Path(__file__).resolve().parents[1])
    client = subprocess.Popen(["ip", "netns", "exec", pair.link.head_ns, sys.executable, str(script), tests, "200"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "begun"
        assert pair.head.ctl("restart").returncode == 0
        draining = pair.head.wait_for(lambda s: (s.get("drain") or {}).get("state") == "draining", 30,
                                      "the head drains")
        assert draining["state"] == "stopping"
        out, _ = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    streams = json.loads(out.strip().splitlines()[-1])
    assert all(s["complete"] for s in streams), streams
    new_head, new_worker = pair.ready(head_launches=2, timeout=120)
    assert new_head != head_pid and new_worker != worker_pid
    drained = [e for e in pair.head.events("drain") if e.get("state") == "drained"]
    stopping = pair.worker.events("stopping")
    assert drained and stopping, (pair.head.events("drain"), stopping)
    assert drained[0]["at"] <= stopping[0]["at"], "the worker's rank was stopped before the head's drain was over"
    assert pair.head.status()["last_stop"]["drain"].startswith("drained in ")
    pair.one_instance_per_node()


def test_the_heads_stop_of_the_group_is_no_failure_on_the_worker(make_pair: Any) -> None:
    """A head whose worker's sparkd is not up yet (two boxes booted together) waits for it within ``peer_grace_s``,
    its status saying so, and starts the pair when it answers: no peer_lost. Then the head's rank ends the moment its
    requests are done (none here: at once), before the head's order reaches the worker: the worker's rank loses its
    head first and prints torch's TCPStore lines, as the real one does. Its sparkd asks the head, which says it stops
    the group — so no peer_lost, no incident, on either node."""
    pair = make_pair(cluster={"peer_grace_s": 60})
    pair.head.start()
    pair.head.wait_for(lambda s: s.get("phase") == "waiting_for_workers", 30, "the head waiting for its worker")
    pair.worker.start()
    pair.ready()
    assert pair.head.ctl("restart").returncode == 0
    pair.ready(head_launches=2)
    assert pair.head.ctl("stop").returncode == 0
    for daemon in (pair.head, pair.worker):
        daemon.wait_for(lambda s: s.get("state") == "stopped", 60, "the group stopped")
    lost_head = [e for e in pair.worker.events("head_stops_the_group")]
    assert "peer_lost" not in pair.worker.log(), lost_head
    assert pair.worker.incidents() == [] and pair.head.incidents() == []
    assert pair.worker.status()["last_failure"] is None
