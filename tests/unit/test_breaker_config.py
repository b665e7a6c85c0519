"""A breaker opened by a config error closes by itself once the config it failed on has changed (issue 28): after
a reload that changes the launch, or at a daemon start with a changed config; an unchanged config keeps it open,
and the status says which."""

from __future__ import annotations

import pytest
from loop_harness import running
from test_daemon_reload import serving, write_config

from sparkd.commands import reload as reload_command
from sparkd.commands.status import render
from sparkd.config import load_config
from sparkd.testing import FakeClock, FakeRuntime

pytestmark = pytest.mark.anyio


async def open_on_config_error(node, runtime: FakeRuntime) -> None:  # type: ignore[no-untyped-def]
    runtime.say("vllm: error: unrecognized arguments: --max-num-seq 4")
    runtime.crash(2)
    await node.until_state("failed")
    assert node.status()["last_failure"]["class"] == "config_error"


async def test_a_reload_with_a_changed_launch_closes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        await open_on_config_error(node, runtime)
        assert (await reload_command.execute(node.daemon.control, reload_command.Request())).ok
        await node.settled()
        assert node.state == "failed"  # the same launch: retrying cannot help
        assert "closes by itself once the config's launch changes" in render(node.status())
        launches = len(runtime.launches)
        write_config(tmp_path, max_model_len=4096)
        assert (await reload_command.execute(node.daemon.control, reload_command.Request())).ok
        await node.until_state("ready")
        assert len(runtime.launches) == launches + 1
        assert "the breaker closed by itself: the config it failed on" in render(node.status())


async def test_a_daemon_start_with_a_changed_config_closes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, runtime = write_config(tmp_path), FakeRuntime()
    async with serving(path, runtime) as node:
        await open_on_config_error(node, runtime)
    async with running(load_config(path), FakeRuntime(), FakeClock()) as node:  # unchanged: stays open
        await node.until_state("failed")
        await node.settled()
        assert node.state == "failed"
    write_config(tmp_path, max_model_len=4096)
    async with running(load_config(path), FakeRuntime(), FakeClock()) as node:
        await node.until_state("ready")
        assert "closed by itself" in render(node.status())
