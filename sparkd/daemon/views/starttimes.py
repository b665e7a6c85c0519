"""How long this node's starts took, kept as each becomes ready (``start-times.json``, :mod:`sparkd.state.starttimes`):
the lint rule ``engine-ready-timeout-below-cold-start`` judges ``VLLM_ENGINE_READY_TIMEOUT_S`` by them. The engine's
part of a start that sparkd timed (an adopted instance's is not), written off the loop by the state writer."""

from __future__ import annotations

from pathlib import Path

from sparkd.daemon.effects.files import StateWriter
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.clock import Clock
from sparkd.state.files import read_json
from sparkd.state.starttimes import START_TIMES, engine_seconds, with_start
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import SERVING, State


class StartTimes:
    def __init__(self, files: StateWriter, state_dir: Path, clock: Clock) -> None:
        self.files = files
        self.path = state_dir / START_TIMES
        self.clock = clock

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if after.machine.state is not State.ready or before.machine.state in SERVING or after.timing is None:
            return
        seconds = engine_seconds(after.timing.to_json())
        if seconds is None:
            return
        at = self.clock.wall()
        launch_hash = after.instance.config_hash if after.instance is not None else after.config.launch_hash()
        self.files.put(self.path, lambda: with_start(read_json(self.path), seconds, at=at, launch_hash=launch_hash))
