"""What the node keeps current beside the lifecycle: the /dev/shm segments the instance holds (noted every
:data:`SHM_NOTE_S`, and at once when it becomes ready: the sweep after its stop removes a segment only with that
proof), and this daemon's registration in the host's instance registry (another instance's unit may have cleared
``/run/sparkd`` meanwhile). Once vLLM is ready, the C heap a start's work grew (the preflight, the launch, the gate)
goes back to the system before the daemon rests (``malloc_trim``: 0.7 MiB of a resting daemon's RSS on a 2-core VM)."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from sparkd.daemon.effects.leftovers import Leftovers
from sparkd.daemon.effects.registry import InstanceRegistry
from sparkd.daemon.loop.nodestate import NodeState
from sparkd.host.heap import trim_heap
from sparkd.supervisor import vocabulary as v
from sparkd.supervisor.states import State

SHM_NOTE_S = 60.0


class Upkeep:
    def __init__(self, node: Callable[[], NodeState], leftovers: Leftovers, registry: InstanceRegistry,
                 trim: Callable[[], None] = trim_heap) -> None:
        self.node = node
        self.leftovers = leftovers
        self.registry = registry
        self.trim = trim
        self.due = anyio.Event()  # vLLM became ready: note what it holds in /dev/shm now

    def on_state(self, before: NodeState, after: NodeState, posted: v.Posted) -> None:
        if after.machine.state is State.ready and before.machine.state is not State.ready:
            self.due.set()

    async def run(self) -> None:
        while True:
            ready = False
            with anyio.move_on_after(SHM_NOTE_S):
                await self.due.wait()
                ready = True
            self.due = anyio.Event()
            await self.leftovers.note_shm(self.node().instance)
            self.registry.write()
            if ready:
                await anyio.to_thread.run_sync(self.trim)
