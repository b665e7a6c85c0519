"""The precision gaps round 5's held-out misses showed (tests/data/heldout-misses.md), each as a general rule tested
both ways with lines of its own: a line of advice is no evidence though it names an error; V0's swap-space count is no
KV cache; an exception that ended a side thread is not the process's end; what the other ranks see of NCCL's failure
(its remote error) does not outrank NCCL's own error before it."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families import judge

F = FailureClass


def ec(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=7) {level} 01-02 03:04:05 [core.py:1] {msg}"


def w1(msg: str) -> str:
    return f"(RayWorkerWrapper pid=9) ERROR 01-02 03:04:06 [worker_base.py:1] {msg}"


@pytest.mark.parametrize("line", [
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "Consider setting NCCL_DEBUG=INFO to see why the NCCL communicator failed.",
    "Please try lowering gpu_memory_utilization if you see CUDA out of memory errors.",
])
def test_a_line_of_advice_is_no_evidence(line: str) -> None:
    """Advice names an error word as what to enable or look for: no family reads it, on an error line or alone."""
    for text in (ec(line), f"[rank0]: {line}", line):
        assert judge(read_events([text])[0]) is None, text


def test_the_same_words_as_a_report_are_evidence() -> None:
    assert classify(1, None, [ec("RuntimeError: CUDA error: device-side assert triggered")]).cls is F.gpu_error
    assert classify(1, None, [ec("device-side assertion `idx < n` failed: device-side assert triggered")]).cls \
        is F.gpu_error


def test_the_error_before_the_hints_is_the_cause() -> None:
    tail = [ec("RuntimeError: CUDA error: out of memory"),
            ec("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")]
    assert classify(1, None, tail).cls is F.oom


@pytest.mark.parametrize(("line", "cls"), [
    ("# GPU blocks: 0, # CPU blocks: 2048", F.config_error),
    ("# TPU blocks: 0, # CPU blocks: 0", F.config_error),
    ("# cpu blocks: 0, # CPU blocks: 0", F.config_error),
    ("# GPU blocks: 2048, # CPU blocks: 0", F.unknown),
    ("# npu blocks: 512, # CPU blocks: 0", F.unknown),
    ("# cpu blocks: 7281, # CPU blocks: 0", F.unknown),
], ids=["gpu none", "tpu none", "cpu none", "gpu swap none", "npu swap none", "cpu swap none"])
def test_the_kv_cache_is_the_first_count_the_swap_space_the_second(line: str, cls: FailureClass) -> None:
    """V0 logs the KV cache's blocks, then the swap space's (`# CPU blocks`, 0 by design on the CPU backend and with
    swap_space=0): only the first at zero is a KV cache of nothing."""
    assert classify(1, None, [ec(line, "INFO")]).cls is cls


SIDE_IMPORT = ["Traceback (most recent call last):",
               '  File "/usr/lib/python3/dist-packages/rich/console.py", line 9, in <module>',
               "    import IPython",
               "ImportError: cannot import name 'display' from 'IPython.core'"]
MAIN_OOM = ["Traceback (most recent call last):",
            '  File "/usr/lib/python3/dist-packages/vllm/worker/worker.py", line 9, in determine_num_available_blocks',
            "    self.model_runner.profile_run()",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]


def test_a_side_threads_error_does_not_outrank_what_ended_the_process() -> None:
    tail = ["Exception in thread log_monitor:", *SIDE_IMPORT, *MAIN_OOM]
    assert classify(1, None, tail).cls is F.oom


def test_the_same_error_in_the_main_thread_comes_first() -> None:
    assert classify(1, None, [*SIDE_IMPORT, *MAIN_OOM]).cls is F.image_error


def test_a_side_threads_error_alone_is_still_read() -> None:
    failure = classify(1, None, ["Exception in thread Thread-2 (_report_usage):", *SIDE_IMPORT])
    assert failure.cls is F.image_error
    assert "IPython" in failure.sentence


def test_the_thread_is_the_next_tracebacks_only() -> None:
    """`Exception in thread X:` names the traceback right after it; a later one is the process's again."""
    tail = ["Exception in thread Thread-1:", "Error:  TBE Subprocess raise error[], main process disappeared!",
            "INFO 01-02 03:04:05 [x.py:1] waiting", "INFO 01-02 03:04:05 [x.py:1] waiting", *SIDE_IMPORT, *MAIN_OOM]
    assert classify(1, None, tail).cls is F.image_error


REMOTE = "RuntimeError: NCCL error: remote process exited or there was a network error"


@pytest.mark.parametrize("own", [
    "RuntimeError: NCCL error: internal error - please report this issue to the NCCL developers",
    "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)",
    "torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, invalid argument (run with "
    "NCCL_DEBUG=WARN for details), NCCL version 2.21.5",
])
def test_nccls_own_error_before_the_others_remote_error_is_the_cause(own: str) -> None:
    failure = classify(1, None, [w1(own), w1(REMOTE)])
    assert failure.cls is F.nccl, failure.sentence


def test_the_remote_error_alone_or_first_is_the_peer() -> None:
    assert classify(1, None, [w1(REMOTE)]).cls is F.peer_lost
    assert classify(1, None, [w1(REMOTE), w1("RuntimeError: NCCL error: unhandled system error")]).cls is F.peer_lost


def test_a_count_beyond_the_devices_is_config_when_raised_not_when_logged() -> None:
    """vLLM raises the refusal at once, or only warns in the same words and waits for Ray to place the ranks."""
    said = "The number of required TPUs exceeds the total number of available TPUs in the placement group."
    assert classify(1, None, [ec(f"ValueError: {said}")]).cls is F.config_error
    assert classify(1, None, [f"NING 04-01 02:45:50 ray_utils.py:320] {said}"]).cls is not F.config_error


SETTING_REFUSED = "ValueError: --kv-cache-dtype fp8 requires a backend with FP8 attention, got TRITON_ATTN"


def test_a_setting_refused_while_vllm_starts_is_config() -> None:
    tail = ["Traceback (most recent call last):",
            '  File "/usr/lib/python3/dist-packages/vllm/v1/attention/selector.py", line 9, in get_attn_backend',
            "    raise ValueError(msg)", SETTING_REFUSED]
    assert classify(1, None, tail).cls is F.config_error


def test_the_same_error_raised_in_the_engines_step_is_the_engines() -> None:
    tail = ["Traceback (most recent call last):",
            '  File "/usr/lib/python3/dist-packages/vllm/v1/engine/core.py", line 9, in step',
            "    out = self.model_executor.execute_model(s)", SETTING_REFUSED]
    assert classify(1, None, tail).cls is F.engine_dead
