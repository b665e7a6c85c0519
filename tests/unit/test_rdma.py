"""RDMA preflight (sparkd/preflight/rdma.py): NCCL_IB_HCA as NCCL reads it, ports and RoCE v2 GIDs from a sysfs
tree the test builds, the locked-memory limit and CAP_IPC_LOCK from /proc texts, and the check itself on this
host through the process runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from sysfs_tree import SysfsTree, roce_gid

from sparkd.config import config_from_mapping
from sparkd.launch.render import render
from sparkd.preflight.base import PreflightContext, Verdict
from sparkd.preflight.rdma import (
    Facts,
    Gid,
    Port,
    chosen_ports,
    decide,
    has_ipc_lock,
    memlock_of,
    parse_selection,
    read_ports,
    roce_v2_index,
)
from sparkd.runtime.process import ProcessRuntime
from sparkd.supervisor.failures import FailureClass

V2 = "RoCE v2"
PORTS = (
    Port("rocep1s0f0", 1, "4: ACTIVE", gids=(Gid(0, "fe80::1", "IB/RoCE v1"), Gid(1, "fe80::1", V2),
                                           Gid(2, roce_gid("10.0.0.9"), "IB/RoCE v1"),
                                           Gid(3, roce_gid("10.0.0.9"), V2), Gid(5, roce_gid("10.0.0.1"), V2))),
    Port("rocep1s0f1", 1, "1: DOWN"),
    Port("roceP2p1s0f0", 1, "4: ACTIVE"),
)
LIMITS = ("Limit                     Soft Limit           Hard Limit           Units\n"
          "Max locked memory         {soft}              {hard}              bytes\n")


@pytest.mark.parametrize(
    ("text", "entries", "exclude", "exact"),
    [
        ("", (), False, False),
        ("rocep1s0f0,roceP2p1s0f0", (("rocep1s0f0", None), ("roceP2p1s0f0", None)), False, False),
        ("=rocep1s0f0:1", (("rocep1s0f0", 1),), False, True),
        ("^rocep1s0f1", (("rocep1s0f1", None),), True, False),
    ],
)
def test_nccl_ib_hca_grammar(text: str, entries: tuple[Any, ...], exclude: bool, exact: bool) -> None:
    selection = parse_selection(text)
    assert (selection.entries, selection.exclude, selection.exact) == (entries, exclude, exact)


@pytest.mark.parametrize(
    ("text", "chosen", "problem"),
    [
        ("", ["rocep1s0f0", "roceP2p1s0f0"], None),
        ("rocep1s0f0", ["rocep1s0f0"], None),  # a prefix: rocep1s0f1 matches too, but it is down
        ("=rocep1s0f1", [], "rocep1s0f1 port 1 is DOWN, not ACTIVE"),
        ("mlx5_0", [], "NCCL_IB_HCA names mlx5_0, which is no RDMA device here (devices: roceP2p1s0f0, rocep1s0f0, "
                       "rocep1s0f1)"),
        ("^rocep1s0f0", ["roceP2p1s0f0"], None),
        ("=rocep1s0f0:2", [], "NCCL_IB_HCA names rocep1s0f0:2, which is no RDMA device here"),
    ],
)
def test_chosen_ports(text: str, chosen: list[str], problem: str | None) -> None:
    ports, problems = chosen_ports(parse_selection(text), PORTS)
    assert [p.hca for p in ports] == chosen
    assert (problems[0].startswith(problem) if problem else problems == []), problems


def test_the_roce_v2_gid_of_the_fabric_address_is_chosen() -> None:
    assert roce_v2_index(PORTS[0], "10.0.0.1") == 5
    assert roce_v2_index(PORTS[0], None) == 3  # else the first IPv4 RoCE v2 one
    assert roce_v2_index(PORTS[2], "10.0.0.1") is None


def test_limits_and_capabilities() -> None:
    assert memlock_of(LIMITS.format(soft="unlimited", hard="unlimited")) == -1
    assert memlock_of(LIMITS.format(soft="8388608", hard="8388608")) == 8388608
    assert memlock_of("Max open files 1024 1024 files\n") is None
    assert has_ipc_lock("CapEff:\t000001ffffffffff\n")  # root / privileged
    assert not has_ipc_lock("CapEff:\t00000000a80425fb\n")  # Docker's default set: no CAP_IPC_LOCK (bit 14)


def facts(**changes: Any) -> Facts:
    base: dict[str, Any] = {"ports": PORTS, "selection": parse_selection("rocep1s0f0"), "devices": ("uverbs0",),
                            "memlock": -1, "address": "10.0.0.1", "gid_index": "5"}
    return Facts(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "verdict", "cls", "words"),
    [
        ({}, Verdict.ok, None, "RoCE v2 GID index 5 on rocep1s0f0 port 1"),
        ({"gid_index": "3"}, Verdict.fail, FailureClass.config_error,
         "NCCL_IB_GID_INDEX is 3, but the RoCE v2 GID of 10.0.0.1 on rocep1s0f0 port 1 is index 5"),
        ({"devices": ()}, Verdict.fail, FailureClass.config_error, "no /dev/infiniband/uverbs* in container c"),
        ({"memlock": 8 << 20}, Verdict.fail, FailureClass.config_error,
         "locked-memory limit in container c is 8.0 MiB"),
        ({"memlock": 8 << 20, "ipc_lock": True}, Verdict.ok, None, "(CAP_IPC_LOCK held)"),
        ({"memlock": 8 << 20, "min_memlock": 4 << 20}, Verdict.ok, None, "locked memory 8.0 MiB"),
        ({"selection": parse_selection("=rocep1s0f1")}, Verdict.fail, FailureClass.nccl, "is DOWN, not ACTIVE"),
        ({"ports": (), "selection": parse_selection("")}, Verdict.warn, None, "NCCL will use TCP sockets"),
        ({"gid_index": None}, Verdict.ok, None, "index 5"),
    ],
)
def test_decide(changes: dict[str, Any], verdict: Verdict, cls: FailureClass | None, words: str) -> None:
    got, found, failure_class = decide(facts(**changes), "in container c")
    assert (got, failure_class) == (verdict, cls), found
    assert words in found


def test_ports_and_gids_are_read_from_sysfs(sysfs: SysfsTree) -> None:
    sysfs.port("rocep1s0f0", gids={0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                                   3: (roce_gid("10.0.0.1"), V2)})
    sysfs.port("rocep1s0f1", state="1: DOWN")
    ports = read_ports(sysfs.root / "class" / "infiniband")
    assert [(p.hca, p.number, p.active) for p in ports] == [("rocep1s0f0", 1, True), ("rocep1s0f1", 1, False)]
    assert [(g.index, g.type) for g in ports[0].gids] == [(0, "IB/RoCE v1"), (3, V2)]
    assert read_ports(sysfs.root / "nothing") == []


def context(tmp_path: Path, sysfs: SysfsTree, env: dict[str, str], **preflight: Any) -> PreflightContext:
    data = {"runtime": "process", "node": {"role": "head", "address": "10.0.0.1"},
            "cluster": {"master_addr": "10.0.0.1", "nnodes": 2}, "preflight": preflight,
            "launch": {"model": "m", "env": env}, "paths": {"state_dir": str(tmp_path / "state")}}
    cfg = config_from_mapping(data, env={})
    return PreflightContext(cfg=cfg, spec=render(cfg), runtime=ProcessRuntime(tmp_path / "run"),
                            sys_root=sysfs.root)


def test_the_check_on_this_host(tmp_path: Path, sysfs: SysfsTree) -> None:
    from sparkd.preflight.rdma import check_rdma

    sysfs.port("rocep1s0f0", gids={3: (roce_gid("10.0.0.9"), V2), 7: (roce_gid("10.0.0.1"), V2)})
    off = anyio.run(check_rdma, context(tmp_path, sysfs, {"NCCL_IB_DISABLE": "1"}))
    assert off.verdict is Verdict.ok and "not in play" in off.found
    result = anyio.run(check_rdma, context(tmp_path, sysfs, {"NCCL_IB_HCA": "rocep1s0f0", "NCCL_IB_GID_INDEX": "3"}))
    assert result.verdict is Verdict.fail and result.failure_class is FailureClass.config_error
    assert "NCCL_IB_GID_INDEX is 3, but the RoCE v2 GID of 10.0.0.1 on rocep1s0f0 port 1 is index 7" in result.found
    if not Path("/dev/infiniband").exists():  # this host has no RDMA driver: where vLLM runs lacks the devices
        assert "there is no /dev/infiniband/uverbs* on this host" in result.found
    missing = anyio.run(check_rdma, context(tmp_path, sysfs, {"NCCL_IB_HCA": "mlx5_0"}))
    assert missing.verdict is Verdict.fail and "NCCL_IB_HCA names mlx5_0" in missing.found
