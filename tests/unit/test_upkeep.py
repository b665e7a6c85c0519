"""What the node keeps current beside the lifecycle (sparkd/daemon/effects/upkeep.py): at once when vLLM becomes
ready, its /dev/shm segments noted, the registration written and the C heap a start's work grew given back; then
every SHM_NOTE_S the notes again, and no trim (nothing new to give back at rest)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from sparkd.daemon.effects import upkeep as upkeep_module
from sparkd.daemon.effects.upkeep import Upkeep
from sparkd.supervisor.states import State


class Notes:
    def __init__(self) -> None:
        self.shm = self.written = self.trims = 0

    async def note_shm(self, instance: Any) -> None:
        self.shm += 1

    def write(self) -> None:
        self.written += 1

    def trim(self) -> None:
        self.trims += 1


def node(state: State) -> Any:
    return SimpleNamespace(machine=SimpleNamespace(state=state), instance=None)


@pytest.mark.anyio
async def test_the_heap_is_trimmed_once_when_vllm_becomes_ready_not_at_every_note(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep_module, "SHM_NOTE_S", 0.05)
    notes = Notes()
    keeper = Upkeep(lambda: node(State.ready), notes, notes, trim=notes.trim)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        keeper.on_state(node(State.starting), node(State.ready), ())  # type: ignore[arg-type]
        with anyio.fail_after(5):
            while notes.trims == 0:
                await anyio.sleep(0.01)
        keeper.on_state(node(State.ready), node(State.ready), ())  # type: ignore[arg-type]  # still ready
        with anyio.fail_after(5):
            while notes.shm < 4:  # the notes every SHM_NOTE_S go on
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert notes.trims == 1 and notes.written >= 4, vars(notes)
