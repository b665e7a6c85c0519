"""The head's proofs before a group's start, end to end: two daemons in network namespaces of the test's own with
a management link and a fabric link (tests/integration/fabric_harness.py). A fabric MTU of 9000 on one end and
1500 on the other, a fabric link down, a worker that drops jumbo don't-fragment echoes; a worker whose copy of the
weights has a corrupted shard; an unchanged group restarting without hashing its shards again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fabric_harness import FabricPair, Routed, Wires

SHARDS = 3


@pytest.fixture
def make_pair(tmp_path: Path) -> Iterator[Any]:
    made: list[FabricPair] = []

    def make(sides: dict[str, dict[str, Any]] | None = None, **sections: dict[str, Any]) -> FabricPair:
        folder = tmp_path / f"p{len(made)}"
        folder.mkdir()
        pair = FabricPair(folder, Wires.create(), sides, **sections)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()


def states_between(status: dict[str, Any], first: str, then: str) -> float:
    """Seconds from the first entry into ``first`` to the next entry into ``then`` (the daemon's own history)."""
    history = [h for h in status["history"] if "phase" not in h]
    start = next(h["at"] for h in history if h["state"] == first)
    return float(next(h["at"] for h in history if h["state"] == then and h["at"] >= start) - start)


def test_an_mtu_mismatch_is_refused_in_seconds_naming_both_interfaces(make_pair: Any) -> None:
    pair = make_pair(fabric={"mtu": 9000})
    pair.wires.mtu("head", 9000)
    pair.wires.mtu("worker", 1500)
    pair.start()
    head = pair.head.wait_for(lambda s: s.get("state") == "failed", 60, "the start refused")
    failure = head["last_failure"]
    assert failure["class"] == "config_error"
    wires = pair.wires
    assert (f"the fabric MTU differs: 9000 on head's {wires.fabric_if['head']} but 1500 on worker's "
            f"{wires.fabric_if['worker']} ([fabric] mtu is 9000)") in failure["message"]
    assert states_between(head, "preflight", "failed") < 5.0
    fabric = head["fabric"][0]
    assert (fabric["ok"], fabric["head"]["mtu"], fabric["worker"]["mtu"]) == (False, 9000, 1500)
    assert pair.worker.status().get("launches", 0) == 0, "no rank was started"


def test_a_fabric_link_down_waits_and_a_peer_dropping_jumbo_echoes_is_refused(make_pair: Any) -> None:
    pair = make_pair(fabric={"mtu": 9000})
    for side in ("head", "worker"):
        pair.wires.mtu(side, 9000)
    pair.wires.link("worker", "down")
    pair.start()
    head = pair.head.wait_for(lambda s: (s.get("last_failure") or {}).get("class") == "host_unavailable", 60,
                              "the start waits for the link")
    assert f"the fabric interface {pair.wires.fabric_if['head']} on head is down" in head["last_failure"]["message"]
    assert head["state"] in ("backoff", "preflight") and not head["breaker"]["open"]
    pair.wires.drop_big_echoes("worker")
    pair.wires.link("worker", "up")
    head = pair.head.wait_for(lambda s: s.get("state") == "failed", 60, "the start refused")
    message = head["last_failure"]["message"]
    assert head["last_failure"]["class"] == "config_error"
    assert (f"a don't-fragment echo of 9000 bytes from head's {pair.wires.fabric_if['head']} to worker "
            f"({pair.wires.fabric['worker']}): no reply") in message
    assert "while a 84-byte one passed: the path does not carry 9000-byte packets" in message


def model(root: Path) -> Path:
    root.mkdir(parents=True)
    names = [f"model-{k:05d}-of-{SHARDS:05d}.safetensors" for k in range(1, SHARDS + 1)]
    for k, name in enumerate(names):
        (root / name).write_bytes(bytes([k + 1]) * (1 << 20))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(enumerate(names))}))
    (root / "config.json").write_text("{}")
    (root / "tokenizer.json").write_text('{"vocab": {}}')
    return root


# perftest's ib_write_bw as the bandwidth run calls it: the server (no address) takes one connection on -p, the
# client (the server's address last) makes it; each prints perftest's result table.
FAKE_PERFTEST = """#!/usr/bin/env python3
import socket, sys, time
args = sys.argv[1:]
port = int(args[args.index("-p") + 1])
if args[-1][0].isdigit():
    deadline = time.monotonic() + 5
    while True:
        try:
            socket.create_connection((args[-1], port), timeout=1).recv(3)
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("Couldn't connect to " + args[-1])
            time.sleep(0.1)
else:
    listener = socket.create_server(("0.0.0.0", port))
    listener.accept()[0].sendall(b"ok\\n")
print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
print(" 65536      424000           0.00               111.13             0.211970")
"""


def fake_perftest(folder: Path) -> dict[str, str]:
    folder.mkdir()
    script = folder / "ib_write_bw"
    script.write_text(FAKE_PERFTEST.replace("/usr/bin/env python3", sys.executable))
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_a_corrupted_shard_on_the_worker_is_refused_and_an_unchanged_restart_hashes_no_shard(
        make_pair: Any, tmp_path: Path) -> None:
    models = {side: model(tmp_path / f"models-{side}") for side in ("head", "worker")}
    pair = make_pair({side: {"weights": {"path": str(models[side])}} for side in models},
                     fabric={"bandwidth": True, "bandwidth_port": 18515})
    shard = models["worker"] / f"model-00002-of-{SHARDS:05d}.safetensors"
    with shard.open("r+b") as f:
        f.seek(1000)
        f.write(b"\xff")
    pair.start(env=fake_perftest(tmp_path / "perftest"))
    head = pair.head.wait_for(lambda s: s.get("state") == "failed", 60, "the start refused")
    assert head["last_failure"]["class"] == "config_error"
    assert (f"1 file(s) differ on worker: {shard.name} has sha256 ") in head["last_failure"]["message"]
    assert head["last_failure"]["message"].count("on worker") == 2  # "differ on worker", "… on worker"
    shutil.copy2(models["head"] / shard.name, shard)
    assert pair.head.ctl("reset").returncode == 0
    pair.head.wait_for(lambda s: s.get("state") == "ready", 90, "the group ready")
    pair.worker.wait_for(lambda s: s.get("state") == "ready", 30, "the worker ready")
    assert pair.head.ctl("restart").returncode == 0
    pair.head.wait_for(lambda s: s.get("state") == "ready" and s.get("launches") == 2, 90, "ready again")
    for daemon in pair.daemons.values():
        local = daemon.status()["weights"]["local"]
        assert (local["files"], local["hashed"], local["pending"]) == (SHARDS + 3, 3, 0), local
    view = pair.head.ctl("weights")
    assert view.returncode == 0 and "weights: the same on every node" in view.stdout, view.stdout + view.stderr
    view = pair.worker.ctl("weights")  # a worker answers for the group, through its head
    assert view.returncode == 0 and "weights (asked of the head " in view.stdout, view.stdout + view.stderr
    assert "): the same on every node" in view.stdout and "  worker: " in view.stdout and "  head: " in view.stdout
    view = pair.worker.ctl("weights", "--local")
    assert view.returncode == 0 and view.stdout.startswith("weights: readable"), view.stdout + view.stderr
    fabric = pair.head.status()["fabric"][0]
    assert fabric["ok"] and fabric["echoes"]["out"][1]["size"] == 1500 and fabric["master"] == "open"
    assert (fabric["bandwidth_gbps"], fabric["bandwidth_note"]) == (111.13, "111.1 Gb/s over 2 s (ib_write_bw)")


ECHO = ("import json, sys; from sparkd.preflight.dfping import df_ping; "
        "print(json.dumps(df_ping(sys.argv[1], int(sys.argv[2])).to_json()))")


def test_a_hop_with_a_smaller_mtu_fails_the_dont_fragment_echo_every_time() -> None:
    routed = Routed.create()
    try:
        def echo(size: int) -> dict[str, Any]:
            done = subprocess.run(["ip", "netns", "exec", routed.ns["a"], sys.executable, "-c", ECHO, routed.b_addr,
                                   str(size)], capture_output=True, text=True, timeout=30, check=True)
            return dict(json.loads(done.stdout))

        assert echo(1500)["ok"]
        big = echo(9000)
        assert (big["ok"], big["error"]) == (False, "a hop needs fragmentation: its MTU is 1500")
        again = echo(9000)  # the kernel knows the path MTU now: only don't-fragment keeps it from fragmenting
        assert (again["ok"], again["error"]) == (False, f"9000 bytes is over the path MTU this node knows to "
                                                        f"{routed.b_addr}: 1500 (EMSGSIZE)")
    finally:
        routed.destroy()
