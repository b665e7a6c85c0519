"""Security review 2 against a real pair in network namespaces: no connection holds anything before it proves
itself, and a signed request means what its sender meant, where it meant it.

- #10: a local user on the worker (not root, same address) holds 16 connections to the head's port, reopening each
  one closed, while the worker's daemon restarts: the pair never loses its peer. Under mutual TLS its connections
  (no certificate) are closed at once, and the real peer's signed request is answered meanwhile;
- #11: from a third host, 8 addresses x 8 connections whose body never comes are closed at the request deadline,
  and /metrics answers another address throughout;
- #12: 1000 silent TLS connections from a third host (no ClientHello) cost the worker next to nothing, and what they
  cost is returned;
- #5, #6, #35: a signature covers Content-Type and the connection's two ends (a request the head signed for the
  worker is refused at the head), and a signed fabric probe reaches only the configured peer and master port.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from attack_tools import LOCAL_USER, holder, outcome
from daemon_harness import render_toml
from pair_harness import Intruder, NodeDaemon, Pair, ip
from test_peer_tls import tls_get, tls_pair  # noqa: F401 (the fixture)

HOLD_S = 35.0  # past the peer grace once the worker's daemon is back
REQUEST_DEADLINE_S = 2.0  # sparkd.api.bounded.FIRST_REQUEST_S (the handshake has 2 s more)


def tune(pair: Pair, *, grace_s: float = 12, leave_running: bool = True) -> Pair:
    """A peer grace long enough for a daemon restart on a loaded machine, and ranks left running across one."""
    for daemon in (pair.head, pair.worker):
        daemon.config["cluster"]["peer_grace_s"] = grace_s
        daemon.config.setdefault("supervisor", {})["leave_running"] = leave_running
        daemon.config_path.write_text(render_toml(daemon.config))
    return pair


def restart(daemon: NodeDaemon) -> None:
    """The worker's daemon ends (its rank left running) and a new one adopts it: it must reach the head again."""
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(60) == 0
    daemon.start()
    daemon.wait_for(lambda s: daemon.proc is not None and s.get("daemon_pid") == daemon.proc.pid
                    and s.get("state") == "ready", 60, "the new worker daemon adopted its rank")


def held_through(pair: Pair, ranks: tuple[int, int], mode: str, during: Any = None) -> dict[str, Any]:
    """A local user on the worker holds 16 connections to the head's port in ``mode`` for HOLD_S while the worker's
    daemon restarts (and ``during`` runs); the pair keeps both ranks and never loses its peer."""
    port = int(pair.head.config["api"]["port"])
    prefix = ["ip", "netns", "exec", pair.link.worker_ns, *LOCAL_USER]
    hold = holder(prefix, pair.link.head_addr, port, 16, HOLD_S, mode)
    try:
        assert hold.stdout is not None and json.loads(hold.stdout.readline())["phase"] == "opened"
        restart(pair.worker)
        if during is not None:
            during()
        stats = outcome(hold, HOLD_S + 60)
    finally:
        if hold.poll() is None:
            hold.kill()
    for daemon, pid in zip((pair.head, pair.worker), ranks, strict=True):
        status = daemon.status()
        assert status["state"] == "ready" and status["pid"] == pid, status
        assert "peer_lost" not in daemon.log(), daemon.log()[-3000:]
    return stats


def test_a_local_user_on_the_worker_cannot_take_its_place_at_the_head(make_pair: Any) -> None:
    """Review 2, #10: 16 body-less requests held the worker's reserved slots forever; the pair looped on peer_lost."""
    pair = tune(make_pair()).start()
    ranks = pair.ready()
    stats = held_through(pair, ranks, "body")
    assert stats["opened"] >= 16 and stats["closed"] > 16, stats  # closed at the deadline, again and again
    assert stats["longest"] < REQUEST_DEADLINE_S + 3, stats


def test_under_mutual_tls_a_connection_without_the_peers_certificate_is_closed(
        tls_pair: tuple[Pair, Path]) -> None:  # noqa: F811 (the fixture)
    pair, pki = tls_pair
    tune(pair).start()
    ranks = pair.ready()
    secret = Path(pair.head.config["api"]["token_file"]).read_text().strip()
    port, answers = int(pair.head.config["api"]["port"]), []

    def the_real_peer_asks() -> None:
        for _ in range(3):
            answers.append(tls_get(pair.link.worker_ns, pair.link.head_addr, port, "/v1/status",
                                   pki / "sparkd-ca.pem", pki / "worker.pem", pki / "worker.key", secret))

    stats = held_through(pair, ranks, "tls-body", the_real_peer_asks)
    assert [a.get("status") for a in answers] == [200, 200, 200], answers
    assert stats["longest"] < REQUEST_DEADLINE_S + 3 and stats["opened"] + stats["handshake_failed"] > 16, stats


SLOW_SOURCES = 8


def test_slow_bodies_from_a_third_hosts_addresses_are_closed_at_the_deadline(make_pair: Any) -> None:
    """Review 2, #11: 7 addresses x 8 connections whose body never came were held for 45 s and more."""
    pair = make_pair().start()
    ranks = pair.ready()
    intruder = Intruder.create(pair.link.worker_ns)
    sources = [intruder.addr.rsplit(".", 1)[0] + f".{10 + i}" for i in range(SLOW_SOURCES)]
    for address in sources:
        ip("addr", "add", f"{address}/32", "dev", "lo", ns=intruder.ns)
    port = int(pair.worker.config["api"]["port"])
    try:
        hold = holder(["ip", "netns", "exec", intruder.ns], pair.link.worker_addr, port, 8 * SLOW_SOURCES, HOLD_S,
                      "body", sources=",".join(sources))
        assert hold.stdout is not None and hold.stdout.readline()
        scraped = []
        for _ in range(4):  # the head's host (a peer's address) scrapes the worker meanwhile: its own room
            time.sleep(2)
            got = subprocess.run(["ip", "netns", "exec", pair.link.head_ns, "curl", "-s", "-o", "/dev/null", "-w",
                                  "%{http_code}", "-m", "5", f"http://{pair.link.worker_addr}:{port}/metrics"],
                                 capture_output=True, text=True, timeout=30)
            scraped.append(got.stdout)
        stats = outcome(hold, HOLD_S + 60)
    finally:
        intruder.destroy()
    assert stats["longest"] < REQUEST_DEADLINE_S + 3 and stats["closed"] >= 48, stats
    assert scraped == ["200"] * 4, scraped
    for daemon, pid in zip((pair.head, pair.worker), ranks, strict=True):
        assert daemon.status()["pid"] == pid and "peer_lost" not in daemon.log()
