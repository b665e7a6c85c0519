"""A reload leaves no part of the daemon on the old config: every key a reload reports "applied now" is the one in
use afterwards, read by the part that uses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_harness import running

from sparkd.commands import reload as reload_command
from sparkd.config import load_config
from sparkd.runtime.base import ExecResult
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio

HEAD_TOML = """
runtime = "process"
[node]
name = "spark0"
role = "head"
rank = 0
address = "127.0.0.1"
[launch]
executable = "/usr/bin/true"
model = "/models/m"
port = 18999
tensor_parallel_size = 2
[cluster]
master_addr = "127.0.0.1"
nnodes = 2
peers = ["127.0.0.1:1"]
[fabric]
bandwidth = true
bandwidth_s = {seconds}
[paths]
state_dir = "{tmp}/state"
run_dir = "{tmp}/run"
instances_dir = "{tmp}/instances"
[api]
socket_group = ""
port = 18998
token_file = "{tmp}/token"
[guard]
enabled = false
[recorder]
enabled = false
settle_s = 0
reboot_after_falls = 0
[health]
canary = false
"""


class Peers:
    """The head's peer link as the bandwidth run uses it: every request kept, answered by an idle server."""

    def __init__(self) -> None:
        self.asked: list[Any] = []
        self.peers = ["127.0.0.1:1"]

    async def call(self, peer: str, command: Any, request: Any, **kw: Any) -> dict[str, Any]:
        self.asked.append(request)
        return {"exit_code": 0, "gbps": None}


async def test_a_reloaded_fabric_bandwidth_s_is_the_heads_next_bandwidth_run(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkd.cluster import bandwidth as bandwidth_module

    monkeypatch.setattr(bandwidth_module, "CLIENT_DELAY_S", 0.0)
    path = tmp_path / "sparkd.toml"
    path.write_text(HEAD_TOML.format(tmp=tmp_path, seconds=2))
    (tmp_path / "token").write_text("a-token-of-the-group-long-enough-to-sign\n")
    async with running(load_config(path), FakeRuntime(), FakeClock()) as node:
        node.daemon.reloader.path = path
        path.write_text(HEAD_TOML.format(tmp=tmp_path, seconds=7))
        reply = await reload_command.execute(node.daemon.control, reload_command.Request())
        assert reply.ok, reply.error
        assert reply.result["settings"] == ["fabric.bandwidth_s: 2 → 7"]  # reported as applied now
        ran: list[list[str]] = []

        async def run(argv: list[str], timeout_s: float) -> ExecResult:
            ran.append(list(argv))
            return ExecResult(0, "")

        fabric = node.daemon.checks.fabric_check
        assert fabric is not None and fabric.bandwidth is not None
        peers = Peers()
        monkeypatch.setattr(fabric.bandwidth, "client", peers)
        monkeypatch.setattr(fabric.bandwidth, "run", run)
        await fabric.bandwidth.measure("127.0.0.1:1", "127.0.0.2")
    assert [r.seconds for r in peers.asked] == [7]  # the worker's server runs as long as the config says now
    assert ran[0][:3] == ["ib_write_bw", "-D", "7"]  # and so does the head's client
