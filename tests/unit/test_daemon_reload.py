"""Config reload through the real loop (sparkctl reload, SIGHUP, restart): daemon settings at once, the launch at
the next start, keys a running daemon cannot take on kept until it restarts, and a config that does not load or
lints with an error changes nothing and refuses a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from loop_harness import Node, running

from sparkd.commands import reload as reload_command
from sparkd.commands import restart
from sparkd.config import load_config
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio


CONFIG_TOML = """
runtime = "process"
[node]
name = "scripted"
role = "single"
[launch]
executable = "/usr/bin/true"
model = "/models/m"
port = 18999
max_model_len = {max_model_len}
[paths]
state_dir = "{tmp}/state"
run_dir = "{tmp}/run"
[api]
socket_group = ""
port = 0
[guard]
enabled = false
[health]
interval_s = {interval}
canary = false
"""


def write_config(tmp: Path, *, max_model_len: int = 8192, interval: float = 5.0, extra: str = "") -> Path:
    path = tmp / "sparkd.toml"
    path.write_text(CONFIG_TOML.format(tmp=tmp, max_model_len=max_model_len, interval=interval) + extra)
    return path


@asynccontextmanager
async def serving(path: Path, runtime: FakeRuntime) -> AsyncIterator[Node]:
    """The daemon loop over the config at ``path`` (reloads read it again), its vLLM ready."""
    async with running(load_config(path), runtime, FakeClock()) as node:
        node.daemon.reloader.path = path
        await node.until_state("ready")
        yield node


async def test_reload_applies_daemon_settings_now_and_the_launch_at_the_next_start(tmp_path: Path) -> None:
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        write_config(tmp_path, max_model_len=16384, interval=2.0)
        assert node.status()["config"]["reload_needed"] is True
        reply = await reload_command.execute(node.daemon.control, reload_command.Request())
        assert reply.ok, reply.error
        assert any("--max-model-len" in line and "16384" in line for line in reply.result["launch"])
        assert reply.result["settings"] == ["health.interval_s: 5.0 → 2.0"]
        assert node.daemon.watching.watch is not None and node.daemon.watching.watch.cfg.interval_s == 2.0
        assert node.status()["config"]["restart_needed"] is True  # running on the old launch until a restart
        assert len(runtime.launches) == 1 and "16384" not in " ".join(runtime.launches[0].argv)
        assert (await node.command(restart)).ok
        await node.until(lambda: len(runtime.launches) == 2 and node.state == "ready")
        assert "16384" in " ".join(runtime.launches[1].argv)
        assert node.status()["config"]["restart_needed"] is False


async def refused_reload_and_restart(node: Node, runtime: FakeRuntime, named: str) -> None:
    """The config on disk is refused: a reload and a restart both fail naming ``named``; vLLM serves on."""
    reply = await reload_command.execute(node.daemon.control, reload_command.Request())
    assert not reply.ok and named in (reply.error or "")
    refused = await node.command(restart)
    assert not refused.ok and named in (refused.error or "")
    assert node.state == "ready" and len(runtime.launches) == 1


async def test_an_invalid_config_on_disk_changes_nothing_and_refuses_a_restart(tmp_path: Path) -> None:
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        before = node.daemon.cfg
        path.write_text(path.read_text().replace("max_model_len = 8192", "max_model_len = -3"))
        await refused_reload_and_restart(node, runtime, "launch.max_model_len")
        assert node.daemon.cfg is before
        assert node.status()["config"]["valid"] is False


async def test_a_config_that_lints_with_an_error_changes_nothing_and_refuses_a_restart(tmp_path: Path) -> None:
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        before = node.daemon.cfg
        write_config(tmp_path, interval=2.0, extra='[launch.env]\nVLLM_WORKER_MULTIPROC_METHOD = "fork"\n')
        await refused_reload_and_restart(node, runtime, "VLLM_WORKER_MULTIPROC_METHOD")
        assert node.daemon.cfg is before and node.daemon.watching.watch is not None
        assert node.daemon.watching.watch.cfg.interval_s == 5.0  # not even the valid part was taken on


async def test_keys_a_running_daemon_cannot_take_on_wait_for_its_restart(tmp_path: Path) -> None:
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        text = path.read_text().replace('name = "scripted"', 'name = "renamed"')
        text = text.replace('runtime = "process"', 'runtime = "docker-run"') + '[container]\nimage = "vllm:x"\n'
        path.write_text(text.replace(f'state_dir = "{tmp_path}/state"', f'state_dir = "{tmp_path}/elsewhere"'))
        reply = await reload_command.execute(node.daemon.control, reload_command.Request())
        assert reply.ok, reply.error
        for key in ("node.name:", "paths.state_dir:", "runtime:"):
            assert any(line.startswith(key) for line in reply.result["at_daemon_restart"]), key
        assert node.daemon.cfg.node.name == "scripted" and node.daemon.cfg.paths.state_dir == tmp_path / "state"
        assert node.daemon.cfg.runtime == "process"  # the running instance stays under the runtime that made it
        assert node.status()["node"] == "scripted"
