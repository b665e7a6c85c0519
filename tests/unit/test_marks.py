"""One attempt at a time (issue 25 §4): `sparkd explain` on a log sparkd wrote reads from the last launch or failed
preflight line, and says sparkd's own verdict again when it logged one (a wedge leaves nothing of its own)."""

from __future__ import annotations

from sparkd.cli.explain import explain
from sparkd.supervisor.marks import attempt, preflight_line, this_launch, verdict, verdict_line

LAUNCH = "---- sparkd: launch vllm serve /m"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
HANG = verdict_line("hang", "the generation canary has had no answer for 8 s …; sparkd restarts vLLM.", "canary: x")
BAD_FLAG = "vllm serve: error: argument --dtype: invalid choice: 'float8' (choose from 'auto', 'bfloat16')"


def test_explain_reads_the_last_attempt_and_sparkds_verdict() -> None:
    log = [LAUNCH, OOM, LAUNCH, "INFO 11-27 09:00:00 [core.py:1] serving", HANG,
           "INFO 11-27 09:00:09 [launcher.py:254] [shutdown] API server: shutdown triggered"]
    failure = explain(log)
    assert failure.cls.value == "hang" and failure.evidence == "canary: x", failure
    assert explain(log[:4]).cls.value != "oom", "an earlier launch's error never explains this one"


def test_a_failed_preflight_is_an_attempt_of_its_own() -> None:
    log = [LAUNCH, "INFO serving", preflight_line("vllm_args"), BAD_FLAG]
    assert attempt(log) == log[2:]
    assert this_launch(log) == log[1:], "the daemon's own classification still reads the launch's lines"
    assert explain(log, 2).cls.value == "config_error"


def test_a_verdict_that_does_not_read_is_ignored() -> None:
    assert verdict(["---- sparkd: failure {not json", "---- sparkd: failure []"]) is None
    assert explain([LAUNCH, OOM, "---- sparkd: failure {\"class\": \"nonsense\", \"sentence\": \"x\"}"]).cls.value \
        == "oom"
