"""A log read by its structure (sparkd/supervisor/tracebacks.py, events.py): Python tracebacks with their chain and
frames, and every line an event with its kind, process, level and time, whatever launcher wrote it."""

from __future__ import annotations

import pytest

from sparkd.supervisor.events import MAX_EVENTS, Kind, read_events
from sparkd.supervisor.subsystems import Subsystem
from sparkd.supervisor.tracebacks import PyException

SITE = "/usr/local/lib/python3.12/site-packages"


def ec(msg: str, pid: int = 7) -> str:
    return f"(EngineCore_DP0 pid={pid}) ERROR 08-15 11:20:19 [core.py:1361] {msg}"


def exceptions(lines: list[str]) -> list[PyException]:
    return [e.exception for e in read_events(lines) if e.exception is not None]


CHAINED = [
    ec("Traceback (most recent call last):"),
    ec(f'  File "{SITE}/vllm/distributed/device_communicators/shm_broadcast.py", line 647, in timeout_ms'),
    ec("    raise TimeoutError"),
    ec("TimeoutError"),
    ec(""),
    ec("The above exception was the direct cause of the following exception:"),
    ec(""),
    ec("Traceback (most recent call last):"),
    ec(f'  File "{SITE}/vllm/v1/executor/multiproc_executor.py", line 264, in collective_rpc'),
    ec("    raise TimeoutError(f\"RPC call to {method} timed out.\") from e"),
    ec("TimeoutError: RPC call to sample_tokens timed out."),
    ec(""),
    ec("During handling of the above exception, another exception occurred:"),
    ec("Traceback (most recent call last):"),
    ec(f'  File "{SITE}/vllm/v1/engine/core.py", line 1393, in run_busy_loop'),
    ec("RuntimeError: EngineCore encountered a fatal error."),
]


def test_a_chain_is_read_root_first() -> None:
    first, second, third = exceptions(CHAINED)
    assert (first.type, first.message, first.cause) == ("TimeoutError", "", None)
    assert second.cause is first and third.cause is second and third.root is first
    assert [e.type for e in third.chain] == ["TimeoutError", "TimeoutError", "RuntimeError"]
    assert first.where == "vllm.distributed.device_communicators.shm_broadcast.timeout_ms"
    assert first.subsystem is Subsystem.rpc and third.subsystem is Subsystem.step
    assert third.stated == "RuntimeError: EngineCore encountered a fatal error."


def test_interleaved_processes_keep_their_own_tracebacks() -> None:
    lines = [ec("Traceback (most recent call last):", 1), ec("Traceback (most recent call last):", 2),
             ec(f'  File "{SITE}/vllm/config/model.py", line 9, in __post_init__', 1),
             ec(f'  File "{SITE}/torch/cuda/__init__.py", line 9, in _lazy_init', 2),
             ec("ValueError: bad setting", 1), ec("RuntimeError: CUDA error: initialization error", 2)]
    config, device = exceptions(lines)
    assert config.subsystem is Subsystem.config and device.subsystem is Subsystem.device
    assert config.process == device.process == "EngineCore_DP0"


def test_an_excerpt_that_starts_mid_traceback_and_a_ray_wrapper() -> None:
    lines = [f'  File "{SITE}/vllm/worker/worker.py", line 132, in init_device',
             "    init_worker_distributed_environment(self.parallel_config, self.rank,",
             "ray.exceptions.RayTaskError(OutOfMemoryError): ray::RayWorkerWrapper.execute_method() (pid=9)"]
    (exc,) = exceptions(lines)
    assert (exc.type, exc.wrapper, exc.name) == ("OutOfMemoryError", "ray.exceptions.RayTaskError", "OutOfMemoryError")
    assert exc.frames[0].code == "init_worker_distributed_environment(self.parallel_config, self.rank,"


def test_a_message_continues_on_indented_lines_and_an_import_is_named() -> None:
    pydantic = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
                "  Value error, Total number of attention heads (4) must be divisible by tensor parallel size (3)"]
    (exc,) = exceptions(pydantic)
    assert exc.message.endswith("must be divisible by tensor parallel size (3)")
    imported = ["Traceback (most recent call last):", f'  File "{SITE}/vllm/__init__.py", line 1, in <module>',
                "    from torchvision import ops", f'  File "{SITE}/torchvision/__init__.py", line 1, in <module>',
                "    x = 1", "RuntimeError: operator torchvision::nms does not exist"]
    assert exceptions(imported)[0].imported == "torchvision"


def test_a_message_a_terminal_wrapped_goes_on() -> None:
    lines = ["ValueError: To serve at least one request with the model's max seq len (196608),",
             "23.25 GiB KV cache is needed, which is larger than the available KV cache memory (22.5 GiB).",
             "INFO 01-01 00:00:00 [x.py:1] next"]
    (exc,) = exceptions(lines)
    assert exc.told.endswith("available KV cache memory (22.5 GiB).") and exc.stated.endswith("(196608),")


def test_code_and_prose_are_not_exceptions() -> None:
    lines = ["Traceback (most recent call last):", '  File "/x/y.py", line 3, in f', "next(self.gen)", "raise",
             "RuntimeError: real"]
    assert [e.summary for e in exceptions(lines)] == ["RuntimeError: real"]
    assert exceptions(["INFO 01-01 00:00:00 [x.py:1] Starting with ValueError handling on"]) == []


@pytest.mark.parametrize(("raw", "text", "process", "time"), [
    ("2026-01-28T23:59:42Z (EngineCore_DP0 pid=972) ERROR 01-28 15:59:42 [core.py:935] ValueError: x",
     "ERROR 01-28 15:59:42 [core.py:935] ValueError: x", "EngineCore_DP0", "01-28 15:59:42"),
    ("ms-pd-decode-6c8f vllm (APIServer pid=1) ERROR 10-27 22:25:30 [v1/engine/async_llm.py:480] Traceback "
     "(most recent call last):", "ERROR 10-27 22:25:30 [v1/engine/async_llm.py:480] Traceback (most recent call "
     "last):", "APIServer", "10-27 22:25:30"),
    ("2026-03-09 01:27:30.1 (MapWorker(MapBatches(vLLMEngineActor)) pid=1202, ip=10.5.1.1) (EngineCore_DP0 "
     "pid=3) INFO 03-08 17:27:28 [shm_broadcast.py:548] No available", "INFO 03-08 17:27:28 [shm_broadcast.py:548] "
     "No available", "EngineCore_DP0", "03-08 17:27:28"),
    ("Feb 21 21:17:57 host env[3210]: (APIServer pid=3210) INFO 02-21 21:17:57 [launcher.py:110] Shutting down",
     "INFO 02-21 21:17:57 [launcher.py:110] Shutting down", "APIServer", "02-21 21:17:57"),
    ("intel-gpu-vllm  | ERROR 12-20 00:16:06 worker_base.py:464] RuntimeError: XPU out of memory.",
     "ERROR 12-20 00:16:06 worker_base.py:464] RuntimeError: XPU out of memory.", None, "12-20 00:16:06"),
    ("[rank0]: RuntimeError: CUDA error: out of memory", "RuntimeError: CUDA error: out of memory", None, None),
    ("^[[36m(RayWorkerWrapper pid=4823, ip=10.2.6.2)^[[0m PC: @     0x7ee184049b8a  (unknown)  addProxyOpIfNeeded()",
     "PC: @     0x7ee184049b8a  (unknown)  addProxyOpIfNeeded()", "RayWorkerWrapper", None),
    ("(EngineCore_1 pid=113803) (VllmWorker rank=0 pid=114020) ERROR 07-01 08:38:50 [x.py:492] RuntimeError: y",
     "ERROR 07-01 08:38:50 [x.py:492] RuntimeError: y", "VllmWorker", "07-01 08:38:50"),
    ("ERROR 2025-07-21 14:34:24.934 factory.py:62] Bfloat16 is only supported",
     "ERROR 2025-07-21 14:34:24.934 factory.py:62] Bfloat16 is only supported", None, "2025-07-21 14:34:24"),
], ids=["CI timestamp", "kubectl", "Ray Data", "journal", "compose, V0 header", "torchrun", "colours as text",
        "0.9's worker", "a build's own year"])
def test_a_launchers_prefix_is_not_the_line(raw: str, text: str, process: str | None, time: str | None) -> None:
    (event,) = read_events([raw])
    assert (event.text, event.process, event.time) == (text, process, time)


@pytest.mark.parametrize(("raw", "kind", "level"), [
    ("host:1:2 [0] NCCL WARN Call to ibv_modify_qp failed", Kind.nccl, "WARNING"),
    ("[rank0]:[E1126 01:23:45.1 811 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout",
     Kind.torch, "ERROR"),
    ("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'", Kind.cuda, "ERROR"),
    ("(raylet) A worker died or was killed while executing a task", Kind.ray, None),
    ("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus", Kind.kernel, "ERROR"),
    ("WARNING 01-02 03:04:05 [x.py:1] slow", Kind.vllm, "WARNING"),
    ("ValueError: bad", Kind.python, None),
    ("2024-11-08 09:37:40,925 vllm.worker.model_runner 849 INFO     CUDA graphs can take additional 1~3 GiB memory per "
     "GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization`", Kind.other, "INFO"),
    ("vllm.engine.llm_engine 849 ERROR    the engine failed", Kind.other, "ERROR"),
    ("2026-06-30 20:54:48.928 | error    |           Metal | Timeout detected (metal_context.cpp:778)", Kind.other,
     "ERROR"),
    ("2026-06-30 20:54:48.928 | info     |           Metal | Serializing Inspector RPC data", Kind.other, "INFO"),
    ("| critical |          Always | TT_FATAL: Creating trace buffers", Kind.other, "CRITICAL"),
], ids=["nccl", "torch", "cuda", "ray", "kernel", "vllm", "python", "python logging's format", "its stamp taken off",
        "a level between bars", "an info between bars", "the bars without the stamp"])
def test_each_line_has_its_kind(raw: str, kind: Kind, level: str | None) -> None:
    (event,) = read_events([raw])
    assert (event.kind, event.level) == (kind, level)


def test_the_kernels_lines_come_first() -> None:
    events = read_events(["RuntimeError: NCCL error"], kernel_lines=("NVRM: Xid (PCI:0): 79",), oom_killed=True)
    assert [(e.kind, e.from_log) for e in events] == [(Kind.kernel, False), (Kind.kernel, False), (Kind.python, True)]


def test_an_exception_vllm_logged_as_its_repr() -> None:
    """V0's engine logs `repr(e)`, then the traceback: one exception, as Python printed it; where the excerpt is cut
    before the traceback ends, the repr is the exception."""
    v0 = "ERROR 03-04 17:31:43 engine.py:136] "
    announced = [f"{v0}ValueError('Attempted to assign 1 x 576 = 576 multimodal tokens to 0 placeholders')",
                 f"{v0}Traceback (most recent call last):",
                 f'{v0}  File "{SITE}/vllm/engine/multiprocessing/engine.py", line 134, in start']
    (exc,) = exceptions(announced)
    assert (exc.type, exc.index) == ("ValueError", 0) and exc.message.startswith("Attempted to assign")
    whole = [*announced, f"{v0}ValueError: Attempted to assign 1 x 576 = 576 multimodal tokens to 0 placeholders"]
    (exc,) = exceptions(whole)
    assert exc.stated.startswith("ValueError: Attempted") and exc.frames
    assert exceptions(["INFO 03-04 17:31:43 engine.py:1] ValueError('x') was handled"]) == []


def test_a_huge_line_is_read_only_so_far() -> None:
    """A dump of a megabyte on one line is read to its first 2048 characters (a tqdm frame each), so the patterns
    stay cheap; an error in a later frame of a tqdm line is still read."""
    (event,) = read_events(["x" * 1_000_000 + " torch.OutOfMemoryError: CUDA out of memory"])
    assert len(event.text) == 2048
    frames = read_events(["\r".join(["Loading: 10%"] * 2000) + "\rtorch.OutOfMemoryError: CUDA out of memory"])
    assert frames[-1].exception is not None and frames[-1].exception.name == "OutOfMemoryError"


# How pastes mangle a log, and the reading that undoes it (events.py).
@pytest.mark.parametrize(("raw", "text"), [
    ("[36m(RayWorkerWrapper pid=9)[0m ERROR 08-15 11:20:19 [core.py:1] ValueError: x",
     "ERROR 08-15 11:20:19 [core.py:1] ValueError: x"),
    ("\\033[36m(Worker pid=9)\\033[0m ERROR 08-15 11:20:19 [core.py:1] ValueError: x",
     "ERROR 08-15 11:20:19 [core.py:1] ValueError: x"),
    ("ERROR 08-15 11:20:19 [core.py:1] ValueError: x^M", "ERROR 08-15 11:20:19 [core.py:1] ValueError: x"),
    ("│ ERROR 08-15 11:20:19 engine.py:157] RuntimeError: y", "ERROR 08-15 11:20:19 engine.py:157] RuntimeError: y"),
    ("[pod/vllm-0/vllm] ERROR 08-15 11:20:19 [core.py:1] ValueError: x",
     "ERROR 08-15 11:20:19 [core.py:1] ValueError: x"),
    ("timeout [5m] reached", "timeout [5m] reached"),
], ids=["colours whose escape a copy dropped", "colours as escaped text", "a carriage return as ^M", "a boxed paste",
        "kubectl's --prefix", "a bracket that is no colour"])
def test_what_a_paste_adds_is_taken_off(raw: str, text: str) -> None:
    (event,) = read_events([raw])
    assert event.text == text


def test_a_paste_that_lost_its_line_breaks_is_split_back() -> None:
    """Many of vLLM's lines joined by spaces on one are read as the lines they were: the traceback's frames, code and
    exception come apart, and NCCL's lines glued after them too."""
    head = "ERROR 11-04 18:02:56 [v1/executor/multiproc_executor.py:597]"
    glued = (f'{head} Traceback (most recent call last): {head} File "{SITE}/vllm/distributed/device_communicators/'
             f'pynccl.py", line 162, in all_reduce {head} raise RuntimeError(f"NCCL error: {{error_str}}") {head} '
             "RuntimeError: NCCL error: unhandled cuda error h0:213:213 [1] NCCL INFO cudaDriverVersion 12080")
    events = read_events([glued])
    assert [e.kind for e in events] == [Kind.frame, Kind.frame, Kind.code, Kind.python, Kind.nccl]
    assert events[3].exception is not None and events[3].exception.subsystem is Subsystem.collective
    (alone,) = read_events(["2026-03-09 01:27:30.1 (EngineCore_DP0 pid=3) INFO 03-08 17:27:28 [x.py:1] a prefix, "
                            "not a glued line"])
    assert alone.text.startswith("INFO 03-08")


def test_a_line_a_terminal_wrapped_is_read_with_its_continuation() -> None:
    """The families read a wrapped line whole, joined both as one word and as two; a bare line after a short one, or
    one that starts a record of its own, is not a continuation."""
    wrapped = read_events(["(Worker pid=1) ERROR 01-02 03:04:05 [kv_cache_utils.py:1] the model needs 4.26 GiB KV cach",
                           "e, more than the 2.1 GiB left after the weights"])
    assert wrapped[0].more == ("e, more than the 2.1 GiB left after the weights",)
    assert "KV cache, more than" in wrapped[0].subject and "kv" in wrapped[0].terms
    separate = read_events(["ERROR 01-02 03:04:05 [x.py:1] short", "e is not a continuation",
                            "ERROR 01-02 03:04:05 [x.py:1] a long line of an error that goes on and on past the wrap",
                            "nvidia-container-cli: requirement error"])
    assert all(not e.more for e in separate)


def test_the_frames_and_levels_other_writers_print() -> None:
    """IPython's frame lines are frames; a bare exception type on its own line is the exception (an excerpt cut after
    its `raise`); torch's glog with a 3-digit date is torch's; uvicorn's and Python logging's INFO are below ERROR."""
    ipython = read_events(["File /opt/conda/lib/python3.11/site-packages/ray/_private/worker.py:2549, in get(refs, "
                           "timeout)", "RayActorError: The actor died unexpectedly before finishing this task."])
    assert ipython[0].kind is Kind.frame and ipython[1].exception is not None and ipython[1].exception.frames
    (bare,) = read_events([ec("TimeoutError")])
    assert bare.exception is not None and bare.exception.name == "TimeoutError"
    (torch,) = read_events(["[W112 01:48:44.277 ProcessGroupNCCL.cpp:1771] Failed to check the flag"])
    assert (torch.kind, torch.time, torch.said) == (Kind.torch, "01-12 01:48:44", "Failed to check the flag")
    levels = read_events(['INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
                          "2024-05-01 10:00:00,123 - vllm - WARNING - a warning", "host:1:2 [0] NCCL INFO Bootstrap"])
    assert all(e.below_error for e in levels)



def test_rays_cpp_lines_have_their_level_and_say_which_node_spoke() -> None:
    """Ray's C++ log line (`[stamp L pid tid] file.cc:N: ...`): its level read (C, a failed check that aborts, is an
    error; I and W below it), its stamp not taken for a launcher's time lead (which left `E 322780 345750]` in front of
    the text), and another node's `(raylet, ip=…)` kept in what it says."""
    worker, raylet, info = read_events([
        "(EngineCore_DP0 pid=1) (RayWorkerWrapper pid=2) [2025-12-12 15:10:48,710 E 322780 345750] raylet_client.cc:"
        "199: Error pushing mutable object: RpcError: RPC Error message: Socket closed",
        "(EngineCore_DP0 pid=1) (raylet, ip=10.0.0.2) [2025-12-12 15:10:48,697 C 42791 42791] (raylet) "
        "experimental_mutable_object_provider.cc:153:  Check failed: object_manager_->WriteAcquire()",
        "[2025-12-12 15:10:40,001 I 42791 42791] (raylet) node_manager.cc:10: Raylet is up"])
    assert (worker.kind, worker.level) == (Kind.ray, "ERROR") and not worker.below_error
    assert worker.said.startswith("raylet_client.cc:199: Error pushing mutable object")
    assert (raylet.level, raylet.said) == ("CRITICAL", "(raylet, ip=10.0.0.2) experimental_mutable_object_provider.cc"
                                                      ":153:  Check failed: object_manager_->WriteAcquire()")
    assert info.below_error and info.said == "node_manager.cc:10: Raylet is up"


def test_a_header_whose_level_a_paste_cut_is_read_as_the_whole_level() -> None:
    """A paste that began inside the line cut the level word's first letters (`RROR`, `ARNING`): vLLM's header is read
    with the level it had, so an exception after it is one; a word that ends no single level, or is a whole one, or a
    line without the header's date and source, is left as it is."""
    cut, warned, other = read_events([
        "RROR 12-18 19:47:34 engine.py:366] ValueError: Total number of attention heads (64) must be divisible by "
        "tensor parallel size (3).", "ARNING 12-18 19:47:35 config.py:10] something to note",
        "OR 12-18 19:47:36 but no source here"])
    assert cut.level == "ERROR" and cut.exception is not None and cut.exception.name == "ValueError"
    assert cut.text.startswith("RROR 12-18")  # quoted as the log has it
    assert (warned.kind, warned.level, warned.below_error) == (Kind.vllm, "WARNING", True)
    assert other.kind is not Kind.vllm and other.text.startswith("OR 12-18")

def test_only_the_last_frames_are_read() -> None:
    """tqdm's bars and glued pastes multiply a tail's lines into frames: the last MAX_EVENTS are read (the kernel's
    lines beside them), so the failure at the end is found and the cost stays bounded."""
    bars = ["\r".join([f"Loading: {i}%"] * 100) for i in range(100)]
    events = read_events([*bars, "torch.OutOfMemoryError: CUDA out of memory"], kernel_lines=("NVRM: Xid 79",))
    assert len(events) == MAX_EVENTS + 1 and events[0].kind is Kind.kernel
    assert events[-1].exception is not None and events[-1].exception.name == "OutOfMemoryError"


def test_advice_at_info_in_python_loggings_format_is_no_error() -> None:
    """vLLM run under a logging config of its own (Python's default format: time, logger, pid, level): its INFO
    advice about memory is not an out-of-memory error (held-out round 15 read it as one)."""
    from sparkd.supervisor.classify import classify
    lines = ["2024-11-08 09:37:40,924 vllm.worker.model_runner 849 INFO     Capturing the model for CUDA graphs.",
             "2024-11-08 09:37:40,925 vllm.worker.model_runner 849 INFO     CUDA graphs can take additional 1~3 GiB "
             "memory per GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization`"]
    assert classify(None, None, lines).cls.value == "unknown"


def test_an_exception_python_ignored_ended_nothing() -> None:
    """`Exception ignored in: <function X.__del__ ...>` (a destructor's at a teardown, held-out round 17): the error
    after it is the cause only where the log says nothing else; the engine's own failure before it says more."""
    from sparkd.supervisor.classify import classify
    worker = "(VllmWorker rank=7 pid=3350875) "
    teardown = [worker + "Exception ignored in: <function CustomAllreduce.__del__ at 0x7efceedfe2a0>",
                worker + "Traceback (most recent call last):",
                worker + f'  File "{SITE}/vllm/_custom_ops.py", line 1758, in free_shared_buffer',
                worker + "RuntimeError: CUDA error: an illegal memory access was encountered"]
    failed = [ec("EngineCore failed to start."),
              ec("RuntimeError: Worker failed with error 'Expected result >= 0 to be true, but got false.'")]
    (ignored,) = exceptions(teardown)
    assert ignored.ignored and ignored.thread is None
    assert classify(1, None, failed + teardown).cls.value == "engine_dead"
    assert classify(1, None, failed + [line.replace("Exception ignored in: ", "") for line in teardown[:1]]
                    + teardown[1:]).cls.value == "gpu_error", "not ignored: the device error is the cause"
    assert classify(1, None, teardown).cls.value == "gpu_error", "alone, it is what the log says"
    thread = exceptions(["Exception in thread ray_print_logs:", "Traceback (most recent call last):",
                         "ModuleNotFoundError: No module named 'IPython'"])
    assert thread[0].thread == "ray_print_logs" and not thread[0].ignored


def test_a_traceback_quoted_as_markdown_is_read() -> None:
    """An issue thread's paste quoted with `> ` (held-out round 17): the exception line is read as one."""
    from sparkd.supervisor.classify import classify
    lines = ["> Traceback (most recent call last):", '  File "demo_vllm.py", line 15, in <module>', "",
             "> torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 214.00 MiB."]
    assert classify(1, None, lines).cls.value == "oom"
    assert read_events(["> > ERROR 02-14 03:51:43 [core.py:1] x"])[0].kind is Kind.vllm
    bold = ["**RuntimeError: CUDA error: no kernel image is available for execution on the device"]
    assert classify(1, None, bold).cls.value == "image_error", "bolded as markdown (held-out round 20)"


def test_pytests_report_of_a_failed_test_is_read() -> None:
    """A CI job's pytest report puts its `E` column in front of the exception (held-out round 21): read as the
    exception line it is; an `E` that begins a word or a glog line is no such column."""
    from sparkd.supervisor.classify import classify
    lines = ["[2025-10-20T13:11:22Z] E           ValueError: Currently, async scheduling only supports `mp` or `uni` "
             "distributed executor backend, but you choose `ray`.",
             "[2025-10-20T13:11:22Z] /usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py:1513: ValueError"]
    assert classify(1, None, lines).cls.value == "config_error"
    (event,) = read_events(["E       RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert event.text.startswith("RuntimeError: CUDA error")
    assert read_events(["E1207 00:55:30.123 socket.cpp:1] x"])[0].text.startswith("E1207")
    assert read_events(["Engine iteration timed out"])[0].text == "Engine iteration timed out"


def test_vllms_config_dump_without_its_header_is_no_error() -> None:
    """vLLM's line that names every setting (`... with config: ... trust_remote_code=True ...`), pasted without its
    INFO header (held-out round 17), is INFO: the setting names in it state no failure."""
    from sparkd.supervisor.classify import classify
    dump = ("Initializing a V1 LLM engine (v0.7.3) with config: model='/qwen2_5-vl-72b', speculative_config=None, "
            "trust_remote_code=True, dtype=torch.bfloat16, tensor_parallel_size=4, quantization=None")
    args = "non-default args: {'model': 'x', 'trust_remote_code': True}"
    assert all(e.below_error for e in read_events([dump, args]))
    assert classify(1, None, [dump, "RuntimeError: CUDA error: device-side assert triggered"]).cls.value == "gpu_error"
    assert classify(1, None, [dump]).cls.value == "unknown"


def test_an_exception_a_wrapper_quotes_inside_its_line_is_read() -> None:
    """A launcher's status quoting a Python exception after words of its own (Triton's model table: `| vllm | 1 |
    UNAVAILABLE: Internal: TypeError: …`) is that exception, its table bar left out; Ray's C++ words naming a status
    (`Status not OK: ChannelError: Channel closed.`) stay Ray's, and prose naming no message is no exception."""
    table, launcher, ray, prose = read_events([
        "| vllm  | 1       | UNAVAILABLE: Internal: TypeError: build_async_engine_client_from_engine_args() got an "
        "unexpected keyword argument 'stat_loggers' |",
        "[vllm] Failed to start engine: ValueError: max_model_len is greater than the derived max_model_len",
        "[2025-11-24 16:14:48,882 C 37444 37444] (raylet) experimental_mutable_object_provider.cc:154:  Check failed: "
        "WriteAcquire() Status not OK: ChannelError: Channel closed.",
        "see the note: ValueError:"])
    assert table.kind is Kind.python and table.exception is not None and table.exception.name == "TypeError"
    assert table.exception.message.endswith("'stat_loggers'") and table.exception.quoted
    assert launcher.exception is not None and launcher.exception.name == "ValueError"
    assert (ray.kind, ray.exception) == (Kind.ray, None)
    assert prose.exception is None


def test_a_traceback_cut_before_its_exception_is_read_from_its_last_statement() -> None:
    """A log that ends inside a traceback, at the last frame's `assert …` or `raise Name("…")`: that statement raised
    the exception (an AssertionError, or the type it names, with its message), at the statement's line and with the
    frames read; a cut at any other statement raises nothing the log can tell."""
    def cut(statement: str) -> list[PyException]:
        events = read_events([
            "Traceback (most recent call last):",
            '  File "/site/lmcache/v1/config.py", line 447, in _validate_config',
            f"    {statement}",
            "           ^^^^^^^^^^^^^^^^^^^^^^"])
        return [e.exception for e in events if e.exception is not None]

    (asserted,) = cut("assert self.enable_controller")
    assert (asserted.name, asserted.stated, asserted.index) == ("AssertionError", "assert self.enable_controller", 2)
    assert [f.func for f in asserted.frames] == ["_validate_config"]
    (raised,) = cut('raise ValueError("no controller")')
    assert (raised.name, raised.message) == ("ValueError", "no controller")
    assert cut("x = f()") == []
