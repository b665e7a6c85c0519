"""A stop from outside sparkd: vLLM's API server got SIGTERM or SIGINT (`docker stop`, systemd, earlyoom, an
orchestrator, a person) and shut down, usually with exit 0. Only the API server's signal handler logs the lines the
rule reads; the daemon classifies only the exits it did not ask for, so a stop sparkd made never gets here."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import FailureClass

F = FailureClass
OUTSIDE = "its API server received SIGTERM or SIGINT from outside sparkd"


def api(msg: str, src: str = "launcher.py:100", level: str = "INFO") -> str:
    return f"(APIServer pid=98719) {level} 07-23 16:29:03 [{src}] {msg}"


def ec(msg: str, src: str = "core.py:1215") -> str:
    return f"(EngineCore pid=98728) INFO 07-23 16:29:03 [{src}] {msg}"


# 0.23+: the handler's own line, then every step of the shutdown (the sequence of vllm#45288's test log).
STOP_024 = (
    "(APIServer pid=98719) INFO:     127.0.0.1:61522 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
    api("[shutdown] API server: shutdown triggered"),
    api("[shutdown] API server: stopping engine client mode=abort timeout=0s", "launcher.py:116"),
    api("[shutdown] MPClient: start timeout=0s", "core_client.py:655"),
    ec("[shutdown] EngineCore: trigger received signal=SIGTERM"),
    ec("[shutdown] EngineCore: start mode=abort timeout=0s", "core.py:1334"),
    ec("[shutdown] EngineCore: exiting busy loop", "core.py:1227"),
    api("[shutdown] API server: engine client stopped", "launcher.py:125"),
    api("[shutdown] API server: shutting down FastAPI HTTP server", "launcher.py:149"),
    "(APIServer pid=98719) INFO:     Shutting down",
)
# 0.11-0.22: the cancelled server's line (launcher.py:110 in 0.12-0.15), then uvicorn's own shutdown.
STOP_013 = (
    api("Shutting down FastAPI HTTP server.", "launcher.py:110"),
    "(APIServer pid=1) INFO:     Shutting down",
    "(APIServer pid=1) INFO:     Waiting for application shutdown.",
    "(APIServer pid=1) INFO:     Application shutdown complete.",
)
ENGINE_DEAD = api("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
                  "for the root cause.", "async_llm.py:525", "ERROR")


@pytest.mark.parametrize(
    ("exit_code", "sig", "tail", "evidence", "says"),
    [
        pytest.param(0, None, STOP_024, "[shutdown] API server: shutdown triggered", ("(exit 0)",), id="0.24"),
        pytest.param(0, None, STOP_013, "Shutting down FastAPI HTTP server.", ("(exit 0)",), id="0.13"),
        # vllm#50067: the systemd scope's SIGTERM reached the engine core too; the API server's EngineDeadError
        # after the stop is its fallout
        pytest.param(0, None, (*STOP_024[:5], ENGINE_DEAD), "shutdown triggered", (), id="EngineDeadError after"),
        # `docker stop`'s grace ran out while vLLM shut down
        pytest.param(None, 9, STOP_024[:6], "shutdown triggered", ("(killed by SIGKILL)",), id="then SIGKILL"),
    ],
)
def test_a_stop_from_outside_is_named(exit_code: int | None, sig: int | None, tail: tuple[str, ...],
                                      evidence: str, says: tuple[str, ...]) -> None:
    failure = classify(exit_code, sig, tail)
    assert failure.cls is F.unknown, failure.sentence
    assert failure.evidence is not None and evidence in failure.evidence
    for part in (OUTSIDE, "`docker stop`", "sparkctl stop", "sparkd restarts with backoff", *says):
        assert part in failure.sentence, failure.sentence
    assert "first error" not in failure.sentence and "journalctl -k" not in failure.sentence


def test_an_error_logged_during_the_stop_is_not_named() -> None:
    """A traceback printed while vLLM shuts down is the stop's fallout, not its cause."""
    failure = classify(1, None, (*STOP_013, "asyncio.exceptions.CancelledError"))
    assert failure.cls is F.unknown and OUTSIDE in failure.sentence, failure.sentence
    assert "CancelledError" not in failure.sentence and "Shutting down FastAPI" in (failure.evidence or "")


@pytest.mark.parametrize(
    ("tail", "cls"),
    [
        pytest.param((api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
                          "core_client.py:606", "ERROR"), *STOP_013), F.engine_dead, id="engine death first"),
        pytest.param((ENGINE_DEAD, *STOP_024), F.engine_dead, id="EngineDeadError first"),
        pytest.param((api("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", level="ERROR"),
                      *STOP_024), F.oom, id="a cause before it"),
    ],
)
def test_what_vllm_logged_before_the_stop_wins(tail: tuple[str, ...], cls: FailureClass) -> None:
    """An orchestrator that stops a vLLM whose engine already died: the death is the cause."""
    failure = classify(0, None, tail)
    assert failure.cls is cls, failure.sentence
    assert OUTSIDE not in failure.sentence


@pytest.mark.parametrize(
    ("exit_code", "tail", "cls"),
    [
        # vLLM's own engine client SIGTERMs the engine core in every shutdown, after an API server crash too
        pytest.param(1, (api("ValueError: the chat template is invalid", level="ERROR"),
                         ec("[shutdown] EngineCore: trigger received signal=SIGTERM")), F.unknown,
                     id="the engine core's signal line"),
        # uvicorn's lines also follow the watchdog's stop after an engine death
        pytest.param(0, STOP_013[1:], F.engine_dead, id="uvicorn's own shutdown lines"),
    ],
)
def test_lines_that_do_not_prove_a_stop_from_outside(exit_code: int, tail: tuple[str, ...],
                                                     cls: FailureClass) -> None:
    failure = classify(exit_code, None, tail)
    assert failure.cls is cls and OUTSIDE not in failure.sentence, failure.sentence



def test_a_stop_in_the_launchers_words() -> None:
    """systemd stopping the unit (the journal's line), Kubernetes killing the container, torchrun's death signal: a stop
    from outside that explains the workers' -15 deaths after it; vLLM's own line for the same stop, after it, says
    more and is the one quoted."""
    journal = "Jul 23 16:29:03 spark-1 systemd[1]: Stopping vllm.service - vLLM OpenAI server..."
    worker = "ERROR 07-23 16:29:04 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 12 died, exit code: -15"
    for first in (journal, "Killing container with id containerd://ab12 Need to kill Pod",
                  "[WARNING] Received 15 death signal, shutting down workers"):
        failure = classify(1, None, [first, worker])
        assert failure.cls is F.unknown and "from outside sparkd" in failure.sentence, failure.sentence
    failure = classify(0, None, [journal, *STOP_013])
    assert failure.cls is F.unknown and OUTSIDE in failure.sentence, failure.sentence
