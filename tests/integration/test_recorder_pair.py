"""A frozen head, told by the flight recorder: a pair in network namespaces, the head's memory running out with its
guard in dry run (late on purpose), the head's daemon and its rank SIGKILLed at once (the freeze), its boot id
changed (the power cycle) and its daemon started again on the same state folder. The head's rank is stopped
(SIGSTOP) rather than killed until the worker has reacted: a frozen host sends no RST, so the worker learns of it
from its peer's silence, not from a closed connection. `sparkctl postmortem` on the
restarted head names the head, the memory trend and the time, and the worker's peer lost ~3 s later.

The head's MemAvailable comes from a meminfo file of the test's own, falling 1 GiB/s from 12 GiB to 300 MiB, as
a leak drives it: taking this shared machine's real memory that low would take the neighbours' with it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakememinfo
import pytest
from daemon_harness import alive, kill_tree, tree
from pair_harness import Link, NodeDaemon, pair_configs

GIB = 1 << 30


class Meminfo(fakememinfo.Meminfo):
    """The head's /proc/meminfo, set by the test."""

    def leak(self, per_s: int, floor: int, stop: threading.Event) -> None:
        while not stop.wait(0.1) and self.available > floor:
            self.set(max(floor, self.available - per_s // 10))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, Any]]:
    link = Link.create()
    head_cfg, worker_cfg = pair_configs(tmp_path, link, recorder={"interval_s": 0.5})
    meminfo = Meminfo(tmp_path / "head-meminfo", 12 * GIB)
    boot = tmp_path / "head-boot-id"
    boot.write_text(f"{uuid.uuid4()}\n")
    head_cfg["guard"].update(meminfo_path=str(meminfo.path), dry_run=True)
    head_cfg["recorder"].update(boot_id_path=str(boot))
    head = NodeDaemon(tmp_path / "head", head_cfg, link.head_ns)
    worker = NodeDaemon(tmp_path / "worker", worker_cfg, link.worker_ns)
    seen: list[Any] = []
    try:
        yield {"head": head, "worker": worker, "meminfo": meminfo, "boot": boot, "seen": seen}
    finally:
        for daemon in (head, worker):
            pid = daemon.status().get("pid")
            if pid:
                seen.extend(tree(pid))
            daemon.end()
        kill_tree(alive(seen))
        link.destroy()


def current(daemon: NodeDaemon, state: str) -> Any:
    return lambda s: daemon.proc is not None and s.get("daemon_pid") == daemon.proc.pid and s.get("state") == state


def test_postmortem_names_the_frozen_head_its_memory_and_the_worker_that_lost_it(pair: dict[str, Any]) -> None:
    head, worker, meminfo = pair["head"], pair["worker"], pair["meminfo"]
    worker.start()
    head.start()
    rank = head.wait_for(current(head, "ready"), 90, "the head ready")["pid"]
    worker.wait_for(current(worker, "ready"), 90, "the worker ready")
    pair["seen"].extend(tree(rank))
    stop = threading.Event()
    leaking = threading.Thread(target=meminfo.leak, args=(GIB, 300 << 20, stop), daemon=True)
    leaking.start()
    try:
        leaking.join(30)
        time.sleep(2)  # the host grinds on under the floors for a moment, then freezes
        # The freeze: the head's rank stops dead with its connections open (a frozen host sends no RST), and its
        # daemon is gone, its ring as the last write left it.
        frozen_at = time.time()
        ranks = tree(rank)
        for proc in ranks:
            proc.send_signal(signal.SIGSTOP)
        head.kill()
    finally:
        stop.set()
    worker.wait_for(lambda s: s.get("state") in ("stopped", "failed") and not s.get("pid"), 60,
                    "the worker stops its rank without its head")
    kill_tree(ranks)  # the power cycle
    pair["boot"].write_text(f"{uuid.uuid4()}\n")
    meminfo.set(20 * GIB)
    head.start()
    head.wait_for(lambda s: head.proc is not None and s.get("daemon_pid") == head.proc.pid, 60, "the head's daemon")
    answer = head.ctl("--json", "postmortem")
    assert answer.returncode == 0, answer.stderr
    report = json.loads(answer.stdout)
    finding = next(f for f in report["findings"] if f["node"] == "head")
    sentence = finding["sentence"]
    print(sentence)
    assert finding["class"] == "host_froze", sentence
    assert report["headline"] == sentence
    assert sentence.startswith("rank 0 (head) froze "), sentence
    assert "after MemAvailable fell below 512 MiB (the guard's kill floor; 300 MiB in its last record" in sentence
    assert "falling " in sentence and " MiB/s over the last" in sentence  # the trend
    assert abs(finding["at"] - frozen_at) < 2.0
    # the time, as the finding has it (its second may be on the other side of a minute from frozen_at's)
    assert time.strftime("at %Y-%m-%d %H:%M:%S UTC", time.gmtime(finding["at"])) in sentence
    assert "the host rebooted" in sentence
    lost = [r for r in finding["reactions"] if r.startswith("rank 1 (worker) lost its peer ")]
    assert lost, sentence
    seconds = float(lost[0].split("lost its peer ")[1].split(" s later")[0])
    assert 2 <= seconds <= 7, lost  # peer_grace_s is 3 s
    text = head.ctl("postmortem").stdout
    assert text.splitlines()[0] == sentence
    assert "the records that show it" in text and "clocks (from the peers' heartbeats" in text, text
