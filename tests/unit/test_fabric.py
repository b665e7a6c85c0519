"""The fabric check's decisions (sparkd/cluster/fabric.py) as tables, its link and GID facts read from a sysfs tree
the test builds (sparkd/preflight/netdev.py, gid.py), and the GID index refusal of the RDMA preflight naming the
index that works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from sysfs_tree import SysfsTree, netdev, roce_gid

from sparkd.cluster.fabric import SMALL, End, Expect, Probes, failure, findings, ping_size
from sparkd.cluster.peers import wire
from sparkd.commands.base import BadRequest
from sparkd.commands.groupcheck import FabricRequest
from sparkd.config import config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.dfping import Ping, checksum, echo_packet
from sparkd.preflight.gid import gid_view
from sparkd.preflight.netdev import Link, read_link
from sparkd.preflight.rdma import check_rdma, read_ports
from sparkd.runtime.process import ProcessRuntime
from sparkd.supervisor.failures import CAUSES, Cause, FailureClass

V2 = "RoCE v2"


def end(node: str, interface: str, *, mtu: int = 9000, speed: int | None = 200000, up: bool = True,
        address: str = "10.0.0.1") -> End:
    return End(node, Link(interface, operstate="up" if up else "down", carrier=up, speed_mbps=speed, mtu=mtu,
                          address=address))


HEAD, WORKER = end("spark0", "enp1s0f0np0"), end("spark1", "enp1s0f1np1", address="10.0.0.2")


def echoes(address: str, size: int = 9000, *, small: bool = True, big: bool = True) -> list[Ping]:
    return [Ping(address, SMALL, small, error=None if small else "no reply within 1 s (3 tries)"),
            Ping(address, size, big, error=None if big else "no reply within 1 s (3 tries)")]


GOOD = Probes(echoes("10.0.0.2"), echoes("10.0.0.1"), "open", "10.0.0.1:29501")


@pytest.mark.parametrize(
    ("ends", "probes", "expect", "cause", "words"),
    [
        ((HEAD, end("spark1", "enp1s0f1np1", mtu=1500)), Probes(echoes("10.0.0.2", big=False), [], "open"),
         Expect(9000), Cause.mtu, ["9000 on spark0's enp1s0f0np0", "1500 on spark1's enp1s0f1np1",
                                   "[fabric] mtu is 9000"]),
        ((end("spark0", "a", mtu=1500), end("spark1", "b", mtu=1500)), GOOD, Expect(9000), Cause.mtu,
         ["is 1500 on spark0's a and spark1's b, not [fabric] mtu = 9000"]),
        ((HEAD, WORKER), Probes(echoes("10.0.0.2"), echoes("10.0.0.1", big=False), "open"), Expect(9000),
         Cause.path_mtu, ["don't-fragment echo of 9000 bytes from spark1's enp1s0f1np1 to spark0 (10.0.0.1)",
                          "does not carry 9000-byte packets"]),
        ((HEAD, WORKER), Probes(echoes("10.0.0.2", small=False, big=False), echoes("10.0.0.1", small=False,
                                                                                  big=False)), Expect(),
         Cause.peer_unreachable, ["spark1's fabric address 10.0.0.2 answers no echo from spark0's enp1s0f0np0"]),
        ((HEAD, end("spark1", "enp1s0f1np1", up=False)), GOOD, Expect(), Cause.link_down,
         ["the fabric interface enp1s0f1np1 on spark1 is down"]),
        ((HEAD, end("spark1", "enp1s0f1np1", speed=100000)), GOOD, Expect(), Cause.speed,
         ["200000 Mb/s on spark0's enp1s0f0np0 but 100000 Mb/s on spark1's enp1s0f1np1"]),
        ((end("spark0", "a", speed=100000), end("spark1", "b", speed=100000)), GOOD, Expect(None, 200000),
         Cause.speed, ["spark0's a is 100000 Mb/s, below [fabric] min_speed_mbps = 200000"]),
        ((HEAD, WORKER), Probes(GOOD.out, GOOD.back, "timed out", "10.0.0.1:29501"), Expect(), Cause.master_port,
         ["spark1 cannot connect to the master port 10.0.0.1:29501 over the fabric (timed out)"]),
    ],
)
def test_each_finding_names_the_node_the_interface_and_the_value(
        ends: tuple[End, End], probes: Probes, expect: Expect, cause: Cause, words: list[str]) -> None:
    found = findings(ends, probes, expect)
    assert found and found[0].cause is cause, found
    for word in words:
        assert word in found[0].sentence
    refusal = failure("10.9.0.2", found)
    assert refusal is not None and refusal.cls is CAUSES[cause][0]
    assert refusal.sentence.startswith("The fabric to the worker on 10.9.0.2 is not ready: ")


def test_a_sound_link_has_no_finding() -> None:
    assert findings((HEAD, WORKER), GOOD, Expect(9000, 200000)) == []
    assert failure("w", []) is None


def test_an_mtu_mismatch_is_not_also_reported_as_its_lost_echo() -> None:
    found = findings((HEAD, end("spark1", "b", mtu=1500)), Probes(echoes("10.0.0.2", big=False),
                                                                  echoes("10.0.0.1", big=False)), Expect())
    assert [f.cause for f in found] == [Cause.mtu]


def test_the_classes_follow_the_nature_of_the_cause() -> None:
    waits = {c for c, (cls, _) in CAUSES.items() if cls is FailureClass.host_unavailable}
    assert waits == {Cause.link_down, Cause.peer_unreachable}
    assert all(cls is FailureClass.config_error for c, (cls, _) in CAUSES.items() if c not in waits)


def test_the_echo_size_is_the_configured_mtu_else_the_heads() -> None:
    assert ping_size(HEAD, Expect(4000)) == 4000
    assert ping_size(end("h", "a", mtu=1500), Expect()) == 1500


def test_an_icmp_echo_carries_a_valid_checksum() -> None:
    packet = echo_packet(0x1234, 7, b"sparkd" * 11)
    assert checksum(packet) == 0 and len(packet) == 8 + 66


def test_link_facts_are_read_from_sysfs(tmp_path: Path) -> None:
    netdev(tmp_path, "enp1s0f0np0", mtu=1500, speed=100000)
    netdev(tmp_path, "enp1s0f1np1", operstate="down", carrier=0, speed=-1)
    up = read_link(tmp_path, "enp1s0f0np0")
    assert (up.up, up.mtu, up.speed_mbps) == (True, 1500, 100000)
    down = read_link(tmp_path, "enp1s0f1np1")
    assert (down.up, down.speed_mbps, down.state) == (False, None, "down")
    assert read_link(tmp_path, "nope").state == "missing"


@pytest.mark.parametrize(
    ("configured", "problem"),
    [
        ("0", "index 0 holds the link-local GID fe80:0000:0000:0000:0000:0000:0000:0001, RoCE v2; the index moves "
              "after a reboot: set it to 3"),
        ("5", "index 5 holds an empty slot; the index moves after a reboot: set it to 3"),
        ("3", None),
    ],
)
def test_the_gid_index_nccl_is_told_is_checked_against_the_fabric_address(
        sysfs: SysfsTree, configured: str, problem: str | None) -> None:
    sysfs.port("rocep1s0f0", gids={0: ("fe80:0000:0000:0000:0000:0000:0000:0001", V2),
                                   3: (roce_gid("10.0.0.1"), V2)}, ndev="enp1s0f0np0")
    sysfs.port("rocep1s0f1", gids={3: (roce_gid("10.1.0.1"), V2)}, ndev="enp1s0f1np1")
    view = gid_view(read_ports(sysfs.root / "class" / "infiniband"), "enp1s0f0np0", "10.0.0.1", configured)
    assert (view.port, view.index) == ("rocep1s0f0 port 1", 3)
    if problem is None:
        assert view.problem is None
    else:
        assert view.problem is not None and problem in view.problem
        assert "NCCL_IB_GID_INDEX is " + configured in view.problem


def test_the_rdma_preflight_refuses_a_link_local_gid_index_naming_the_one_that_works(
        tmp_path: Path, sysfs: SysfsTree) -> None:
    sysfs.port("rocep1s0f0", gids={0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                                   1: ("fe80:0000:0000:0000:0000:0000:0000:0001", V2),
                                   3: (roce_gid("10.0.0.1"), V2)}, ndev="enp1s0f0np0")
    cfg = config_from_mapping({
        "runtime": "process", "node": {"name": "spark0", "role": "head", "address": "10.0.0.1"},
        "cluster": {"nnodes": 2, "master_addr": "10.0.0.1"},
        "launch": {"model": "m", "env": {"NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "1"}},
        "paths": {"state_dir": str(tmp_path / "s")}}, env={})
    ctx = PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path / "run"), sys_root=sysfs.root)
    result = anyio.run(check_rdma, ctx)
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert "NCCL_IB_GID_INDEX is 1, but the RoCE v2 GID of 10.0.0.1 on rocep1s0f0 port 1 is index 3" in result.found
    assert "index 1 holds the link-local GID fe80:" in result.found and "set it to 3" in result.found


@pytest.mark.parametrize(
    "params",
    [{"size": 9000, "master": ["10.0.0.1"]}, {"size": "lots"}, {"size": 10}, {"size": 9000, "timeout_s": 99},
     {"size": 9000, "address": 7}, {"size": 9000, "master": ["10.0.0.1", 99999]}],
)
def test_a_bad_fabric_request_is_refused_naming_the_parameter(params: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        FabricRequest.from_params(params)


def test_a_fabric_request_reaches_only_the_configured_peers_and_this_groups_master() -> None:
    """Security review 2, #35: a signed peer made the head ping 10.252.0.3 and connect to its port 4444."""
    from sparkd.cluster.fabric_probe import configured_targets, unasked

    cfg = config_from_mapping({"runtime": "process", "node": {"name": "w", "role": "worker", "rank": 1},
                               "launch": {"model": "/m", "tensor_parallel_size": 2},
                               "cluster": {"peers": ["10.252.0.1:9479"], "master_addr": "10.252.1.1",
                                           "master_port": 29501, "nnodes": 2}}, env={})
    targets = configured_targets(cfg, lambda host: [])
    assert targets == {"10.252.0.1", "10.252.1.1"}
    assert unasked(cfg, "10.252.1.1", ("10.252.1.1", 29501), targets) == ("10.252.1.1", ("10.252.1.1", 29501), [])
    address, master, refused = unasked(cfg, "10.252.0.3", ("10.252.0.3", 4444), targets)
    assert address is None and master is None
    assert refused == ["10.252.0.3 is not a configured peer's address ([cluster] peers, master_addr): not pinged",
                       "10.252.0.3:4444 is not this group's master_addr:master_port: not connected to"]
    assert unasked(cfg, None, ("10.252.1.1", 22), targets)[1] is None  # the right host, another port


PERFTEST = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : rocep1s0f0
 Link type       : Ethernet
 GID index       : 3
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      424000           0.00               111.13             0.211970
---------------------------------------------------------------------------------------
"""


def test_the_bandwidth_figure_is_perftests_average() -> None:
    from sparkd.cluster.bandwidth import argv, parse_gbps

    assert parse_gbps(PERFTEST) == 111.13
    assert parse_gbps("Couldn't connect to 10.0.0.2:18515") is None
    assert argv(2, 18515, "rocep1s0f0 port 1", 3, "10.0.0.2") == [
        "ib_write_bw", "-D", "2", "-p", "18515", "--report_gbits", "-F", "-d", "rocep1s0f0", "-i", "1", "-x", "3",
        "10.0.0.2"]


class FakePeers:
    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, object]] = []

    async def request(self, peer: str, method: str, path: str, **kw: object) -> dict[str, object]:
        self.asked.append((path, kw.get("json")))
        return self.answer

    async def call(self, peer: str, command: Any, request: Any, **kw: object) -> dict[str, object]:
        method, path, body = wire(command, request)  # what PeerClient sends: the wire is asserted below
        return await self.request(peer, method, path, json=body, **kw)


@pytest.mark.parametrize(
    ("here", "there", "gbps", "note"),
    [
        ((0, PERFTEST), {"exit_code": 0, "gbps": 111.13}, 111.13, "111.1 Gb/s over 2 s (ib_write_bw)"),
        ((127, ""), {"exit_code": 127}, None, "ib_write_bw is not installed where vLLM runs on the head"),
        ((1, ""), {"exit_code": 127}, None, "ib_write_bw is not installed where vLLM runs on w"),
    ],
)
def test_a_bandwidth_run_is_the_client_here_against_the_server_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: tuple[int, str], there: dict[str, object],
        gbps: float | None, note: str) -> None:
    from sparkd.cluster import bandwidth
    from sparkd.runtime.base import ExecResult

    ran: list[list[str]] = []

    async def run(argv: list[str], timeout_s: float) -> ExecResult:
        ran.append(list(argv))
        return ExecResult(here[0], here[1])

    cfg = config_from_mapping({"runtime": "process", "launch": {"model": "m"}, "paths": {"state_dir": str(tmp_path)},
                               "fabric": {"bandwidth": True}}, env={})
    peers = FakePeers(there)
    monkeypatch.setattr(bandwidth, "CLIENT_DELAY_S", 0.0)
    bw = bandwidth.Bandwidth(lambda: cfg, peers, run, log=type("L", (), {"info": lambda *a, **k: None})())  # type: ignore[arg-type]
    assert anyio.run(bw.measure, "w", "10.0.0.2") == (gbps, note)
    assert peers.asked == [("/v1/rank/bandwidth", {"seconds": 2, "port": 18515})]
    assert ran[0][-1] == "10.0.0.2" and ran[0][:3] == ["ib_write_bw", "-D", "2"]


def test_the_fabric_and_weights_metrics_come_from_status() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from sparkd.daemon.views.checkmetrics import families

    status = {"fabric": [{"peer": "10.9.0.2", "ok": False, "bandwidth_gbps": 96.5,
                          "head": {"interface": "a", "mtu": 9000, "speed_mbps": 200000},
                          "worker": {"interface": "b", "mtu": 1500, "speed_mbps": 200000}}],
              "weights": {"group": {"ok": True}, "local": {"pending": 4}}}

    class Collector:
        def collect(self) -> object:
            return families(["node"], ["spark0"], status)

    registry = CollectorRegistry()
    registry.register(Collector())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    for line in ('sparkd_fabric_ok{node="spark0",peer="10.9.0.2"} 0.0',
                 'sparkd_fabric_mtu_bytes{end="worker",interface="b",node="spark0",peer="10.9.0.2"} 1500.0',
                 'sparkd_fabric_bandwidth_gbps{node="spark0",peer="10.9.0.2"} 96.5',
                 'sparkd_weights_same{node="spark0"} 1.0', 'sparkd_weights_hash_pending_files{node="spark0"} 4.0'):
        assert line in text, text


def test_an_end_whose_config_names_no_fabric_interface_is_not_checked_nor_refused() -> None:
    from sparkd.cluster.fabric import unchecked
    from sparkd.preflight.netdev import UNNAMED

    assert unchecked((HEAD, End("spark1", None, UNNAMED))) == f"spark1: {UNNAMED}"
    assert unchecked((HEAD, End("spark1", None, "no interface holds the fabric address 10.0.0.2"))) is None
    assert unchecked((HEAD, WORKER)) is None


def test_an_ipv6_fabric_gets_no_echo_and_no_echo_finding() -> None:
    from sparkd.cluster.fabric_probe import echoes

    assert anyio.run(echoes, "fd00::2", 9000) == []
    six = (end("spark0", "a", address="fd00::1"), end("spark1", "b", address="fd00::2"))
    assert findings(six, Probes([], [], "open"), Expect(9000)) == []
