"""The real daemon loop in-process over sparkd.testing's fakes, shared by the scripted tests (no tests here).

:func:`running` builds the real :class:`~sparkd.daemon.app.Daemon` over a FakeRuntime and a FakeClock, runs it in
a task group until its boot is done, and yields a :class:`Node` to drive it through the same control commands
sparkctl sends. Leaving the block cancels the daemon as a kill would (its state files are flushed, as a
watchdog kill leaves what was written); running it again over the same state directory is a daemon restart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from sparkd.config import Config, config_from_mapping
from sparkd.daemon.adapters import Adapters
from sparkd.daemon.app import Daemon
from sparkd.testing import FakeClock, FakeNotifier, FakeProbes, FakeRuntime, all_tasks_blocked, passing_check

SETTLE_TIMEOUT_S = 30.0  # real seconds an effect may take in a worker thread (an incident write: milliseconds)


def config(tmp: Path, **sections: dict[str, Any]) -> Config:
    return config_from_mapping(config_data(tmp, **sections), source="test")


def config_data(tmp: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """The config of :func:`config` as its TOML tables (to write it to a file a command line reads)."""
    data: dict[str, Any] = {
        "runtime": "process",
        "node": {"name": "scripted", "role": "single"},
        "launch": {"executable": "/usr/bin/true", "model": "/models/m", "port": 18999},
        "paths": {"state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"),
                  "instances_dir": str(tmp / "instances")},
        "api": {"socket_group": "", "port": 0},
        "guard": {"enabled": False},
        # The flight recorder, the memory settle and the restart gate have tests of their own (test_recorder_loop).
        "recorder": {"enabled": False, "settle_s": 0, "reboot_after_falls": 0},
        "restart": {"backoff_initial_s": 10, "backoff_max_s": 300, "jitter": 0.1, "budget_failures": 3,
                    "budget_window_s": 1800, "consecutive_limit": 0},
        "health": {"interval_s": 5, "canary": False},
        # The acceptance gate has tests of its own (test_acceptance_loop, with FakeAnswers).
        "acceptance": {"enabled": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return data


class Node:
    """One node's daemon under test: the real loop, fake parts, the same commands sparkctl sends."""

    def __init__(self, cfg: Config, runtime: FakeRuntime, clock: FakeClock, *, rand: float | None = 0.5,
                 checks: tuple[Any, ...] | None = None, **options: Any) -> None:
        """``rand``: every jitter draw; None leaves the daemon its own random draws. ``options``: the other
        :class:`~sparkd.daemon.adapters.Adapters` (``gpus``: the GPU reader, ``guard``: a stand-in guard, ``probes``:
        the probes of each instance, by default ``FakeProbes``)."""
        self.cfg, self.runtime, self.clock = cfg, runtime, clock
        self.notifier = FakeNotifier()
        draw: dict[str, Any] = {} if rand is None else {"rand": lambda: rand}
        options.setdefault("probes", lambda: FakeProbes(runtime))
        adapters = Adapters(clock=clock, notifier=self.notifier,  # type: ignore[arg-type]
                            checks=checks if checks is not None else (passing_check(),), sweep=(), **draw, **options)
        self.daemon = Daemon(cfg, runtime, adapters=adapters)

    @property
    def state(self) -> str:
        return self.daemon.sup.machine.state.value

    def listen(self, hook: Callable[[Any, Any, Any], None]) -> None:
        """Call ``hook(before, after, observation)`` with the lifecycle's machines at every change of the machine,
        after the daemon's own ``on_state``."""
        sup = self.daemon.sup
        previous = sup.on_state

        def on_state(before: Any, after: Any, posted: Any) -> None:
            previous(before, after, posted)
            if after.machine is not before.machine:
                hook(before.machine, after.machine, posted)

        sup.on_state = on_state

    def status(self) -> dict[str, Any]:
        return self.daemon.view.status()

    async def until(self, done: Callable[[], bool], limit_s: float = 3600) -> float:
        return await self.clock.run_until(done, limit_s=limit_s)

    async def until_state(self, state: str, limit_s: float = 3600) -> float:
        return await self.until(lambda: self.state == state, limit_s)

    async def crash_into(self, state: str, times: int = 1) -> None:
        """``times`` times: wait for ready, crash vLLM, wait for ``state`` (backoff, failed)."""
        for _ in range(times):
            await self.until_state("ready")
            self.runtime.crash()
            await self.until_state(state)

    async def settled(self) -> None:
        """Every effect the loop started has finished: an incident is written in a worker thread, which
        ``all_tasks_blocked`` alone takes for a blocked task."""
        with anyio.fail_after(SETTLE_TIMEOUT_S):
            while True:
                await all_tasks_blocked()
                if self.daemon.sup.effects_running == 0:  # none of preflight, launch, stop, record runs
                    return
                await anyio.sleep(0.001)

    async def command(self, module: Any) -> Any:
        return await module.execute(self.daemon.control, module.COMMAND.request())


@asynccontextmanager
async def running(cfg: Config, runtime: FakeRuntime, clock: FakeClock, **kw: Any) -> AsyncIterator[Node]:
    node = Node(cfg, runtime, clock, **kw)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.daemon.run)
        await node.until(lambda: node.daemon.sup.booted.is_set())
        yield node
        tg.cancel_scope.cancel()
