"""A probe's verdict against vLLM's logged death (sparkd.supervisor.deathlog): the log's words win only where they
name how the engine died; a wedge stays a wedge unless the log tells of the engine's death."""

from __future__ import annotations

import pytest

from sparkd.supervisor.deathlog import names_the_death, told_by_the_log
from sparkd.supervisor.failures import Failure, FailureClass

F = FailureClass
PROBED_DEAD = Failure.of(F.engine_dead, "vLLM's /health answers 503: the engine is dead; sparkd restarts vLLM.")
PROBED_HANG = Failure.of(F.hang, "the canary got no token for 60 s; sparkd restarts vLLM.")
PROBED_OOM = Failure.of(F.oom, "the guard saw the memory run out.")
SIGTERMED = Failure(F.engine_dead, "The engine core received SIGTERM from outside sparkd (PID 1234); sparkd restarts.",
                    None, None, "EngineCore received SIGTERM")
BARE_DEATH = Failure(F.engine_dead, Failure.of(F.engine_dead, "").treatment.what + " (no line names more)", None,
                     None, "EngineDeadError")
NO_EVIDENCE = Failure(F.engine_dead, "The engine died after a CUDA error; sparkd restarts.", None, None, None)
LOGGED_OOM = Failure(F.oom, "CUDA out of memory while allocating 2 GiB; lower gpu_memory_utilization.", None, None,
                     "torch.OutOfMemoryError: CUDA out of memory")


@pytest.mark.parametrize(("probed", "told", "wins"), [
    (PROBED_DEAD, SIGTERMED, "told"),  # the log names the death: its sentence
    (PROBED_DEAD, BARE_DEATH, "probed"),  # the log says no more than the class's default
    (PROBED_DEAD, NO_EVIDENCE, "probed"),  # no line to rest on
    (PROBED_DEAD, LOGGED_OOM, "told"),  # a death the log names, whatever its class
    (PROBED_HANG, SIGTERMED, "told"),  # a dying engine answers no canary: no wedge
    (PROBED_HANG, LOGGED_OOM, "probed"),  # a wedge stays one unless the log tells of the engine's death
    (PROBED_OOM, SIGTERMED, "probed"),  # not a verdict the log explains better
])
def test_the_logs_death_wins_only_where_it_names_it(probed: Failure, told: Failure, wins: str) -> None:
    assert told_by_the_log(probed, told) is (told if wins == "told" else probed)


def test_a_death_is_named_by_a_line_that_says_more_than_the_default() -> None:
    assert names_the_death(SIGTERMED) and not names_the_death(BARE_DEATH) and not names_the_death(NO_EVIDENCE)
