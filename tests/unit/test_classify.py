"""Failure classification: exit code + signal + log tail → class, sentence, evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sparkd.supervisor.classify import MAX_SCAN_LINES, ClassifyContext, classify
from sparkd.supervisor.failures import FailureClass

F = FailureClass
CYAN, RESET = "\x1b[0;36m", "\x1b[0;0m"


def api(msg: str, level: str = "ERROR", src: str = "core.py:866") -> str:
    """A line as the head's API server writes it to a TTY: coloured prefix, vLLM header."""
    return f"{CYAN}(APIServer pid=2172){RESET} {level} 11-26 01:23:45 [{src}] {msg}"


def ec(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=2301) {level} 11-26 01:23:45 [core.py:866] {msg}"


def w0(msg: str, level: str = "ERROR") -> str:
    return f"(Worker_TP0 pid=2390) {level} 11-26 01:23:45 [multiproc_executor.py:727] {msg}"


def w1(msg: str) -> str:
    return f"(Worker_TP1 pid=811) {msg}"


FREE_MEM = (
    "ValueError: Free memory on device cuda:0 (36.75/121.63 GiB) on startup is less than desired GPU "
    "memory utilization (0.85, 103.38 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
    "other processes."
)
FREE_MEM_013 = (
    "ValueError: Free memory on device (101.3/121.69 GiB) on startup is less than desired GPU memory "
    "utilization (0.9, 109.52 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
ENGINE_INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}"
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
    "119.70 GiB of which 512.00 MiB is free."
)
EADDRINUSE = (
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
    "address. port: 29501, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
)
PEER_RECV = (
    "[rank1]:[W1126 01:23:45.123456 811 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=41, "
    "addr=[::ffff:10.0.0.2]:51234, remote=[::ffff:10.0.0.1]:29501): Failed to recv, got 0 bytes. Connection "
    "was likely closed. Did the remote server shutdown or crash?"
)
PEER_DUMP = (
    "[rank1]:[W1126 01:23:46.000000 811 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0 Rank 1] Failed to "
    'check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), with '
    "error: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or "
    "crash?"
)
RETRY = (
    "[W1126 01:20:04.123456 811 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host "
    "10.0.0.1:29501 - retrying (try=0, timeout=600000ms, delay=1000ms): Connection refused"
)


@dataclass(frozen=True)
class Case:
    exit_code: int | None
    signal: int | None
    tail: tuple[str, ...]
    cls: FailureClass
    evidence_has: str | None = None  # a substring of the evidence line; None: no evidence expected
    sentence_has: tuple[str, ...] = ()
    hint: FailureClass | None = None
    ctx: ClassifyContext = field(default_factory=ClassifyContext)


CASES: dict[str, Case] = {
    # ---- config errors ----
    "exit 127, launch target named by the context": Case(
        127,
        None,
        (),
        F.config_error,
        None,
        (
            "The launch target /workspace/vllm-head.sh does not exist (exit 127); fix [launch] in the config — "
            "sparkd will not retry a config error.",
        ),
        ctx=ClassifyContext(launch_target="/workspace/vllm-head.sh"),
    ),
    "exit 127 with the shell's line naming the missing script": Case(
        127,
        None,
        ("/bin/bash: /workspace/vllm-head-090.sh: No such file or directory",),
        F.config_error,
        "vllm-head-090.sh",
        ("/workspace/vllm-head-090.sh does not exist (exit 127)",),
    ),
    "exit 127: a command inside the script was not found": Case(
        127,
        None,
        ("/workspace/vllm-head.sh: line 12: vllm: command not found",),
        F.config_error,
        "command not found",
        ("The command vllm was not found (exit 127)",),
        ctx=ClassifyContext(launch_target="/workspace/vllm-head.sh"),
    ),
    "exit 127 with no log and no context": Case(
        127,
        None,
        (),
        F.config_error,
        None,
        ("does not exist (exit 127)", "will not retry"),
    ),
    "exit 126: launch target not executable": Case(
        126,
        None,
        (),
        F.config_error,
        None,
        ("The launch target /workspace/vllm-head.sh is not executable (exit 126)",),
        ctx=ClassifyContext(launch_target="/workspace/vllm-head.sh"),
    ),
    "docker exec of a missing path (OCI error, exit 127)": Case(
        127,
        None,
        (
            'OCI runtime exec failed: exec failed: unable to start container process: exec: "/workspace/x.sh": '
            "stat /workspace/x.sh: no such file or directory: unknown",
        ),
        F.config_error,
        "OCI runtime",
        ("/workspace/x.sh does not exist in the container",),
    ),
    "unknown vLLM flag": Case(
        2,
        None,
        ("usage: vllm serve [model_tag] [options]", "vllm serve: error: unrecognized arguments: --enable-foo --bar 3"),
        F.config_error,
        "unrecognized arguments",
        ("vLLM does not know the argument(s) --enable-foo --bar 3 (exit 2)", "will not retry"),
    ),
    "argparse rejects a value": Case(
        2,
        None,
        ("vllm serve: error: argument --dtype: invalid choice: 'fp7'",),
        F.config_error,
        "--dtype",
        ("rejected the argument --dtype",),
    ),
    "max_model_len larger than derived (wrapped in pydantic)": Case(
        1,
        None,
        (
            api("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"),
            "  Value error, User-specified max_model_len (2097152) is greater than the derived max_model_len "
            "(max_position_embeddings=1048576 or model_max_length=None in model's config.json). To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
        ),
        F.config_error,
        "User-specified max_model_len",
        ("max_model_len 2097152 is larger than the model allows", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"),
    ),
    "pydantic validation error alone": Case(
        1,
        None,
        (api("pydantic_core._pydantic_core.ValidationError: 2 validation errors for VllmConfig"),),
        F.config_error,
        "validation errors",
        ("VllmConfig rejected a setting",),
    ),
    "DSpark uniform-inputs error": Case(
        1,
        None,
        (ec("ValueError: DSpark currently requires uniform flattened per-request inputs"), ec(ENGINE_INIT_FAILED)),
        F.config_error,
        "DSpark",
        ("requires uniform flattened per-request inputs",),
    ),
    "KV cache cannot hold one max-length request": Case(
        1,
        None,
        (
            w0(
                "ValueError: To serve at least one request with the models's max seq len (1048576), (40.50 GiB "
                "KV cache is needed, which is larger than the available KV cache memory (18.08 GiB). Based on "
                "the available memory, the estimated maximum model length is 467000."
            ),
            api(ENGINE_INIT_FAILED),
        ),
        F.config_error,
        "max seq len",
        ("max_model_len 1048576", "40.50 GiB", "18.08 GiB"),
    ),
    "python cannot open the launch script": Case(
        2,
        None,
        ("python3: can't open file '/workspace/serve.py': [Errno 2] No such file or directory",),
        F.config_error,
        "can't open file",
        ("/workspace/serve.py does not exist (exit 2)",),
    ),
    # ---- the shell "not found" rule is held to a higher bar ----
    "a benign 'not found' from a helper does not make a config error": Case(
        0,
        None,
        (
            "sh: 1: nvidia-smi: not found",
            api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
        ),
        F.engine_dead,
        "died unexpectedly",
    ),
    # ---- memory ----
    "free-memory refusal beats the generic init failure after it": Case(
        1,
        None,
        (w0("WorkerProc failed to start."), w0(FREE_MEM), ec("EngineCore failed to start."), api(ENGINE_INIT_FAILED)),
        F.free_memory_refusal,
        "Free memory on device cuda:0",
        (
            "only 36.75 of 121.63 GiB was free and it wants 103.38 GiB at gpu_memory_utilization 0.85, with "
            "8.0 GiB MemAvailable (exit 1)",
            "drops caches",
        ),
        ctx=ClassifyContext(mem_available_bytes=8 * 1024**3),
    ),
    "free-memory refusal, 0.13 wording without the device": Case(
        1,
        None,
        (w0(FREE_MEM_013),),
        F.free_memory_refusal,
        "101.3/121.69",
        ("only 101.3 of 121.69 GiB was free",),
    ),
    "CUDA OOM while loading weights": Case(
        1,
        None,
        (
            w0(
                "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
                "memory for weights. (original error: CUDA out of memory. Tried to allocate 1.00 GiB.)"
            ),
            w0(TORCH_OOM),
            api(ENGINE_INIT_FAILED),
        ),
        F.oom,
        "Failed to load model",
        ("ran out of memory while loading the weights",),
    ),
    "torch OOM": Case(1, None, (w0(TORCH_OOM),), F.oom, "OutOfMemoryError", ("CUDA ran out of memory",)),
    "kernel OOM killer line in the tail, killed by SIGKILL": Case(
        None,
        9,
        ("Out of memory: Killed process 2390 (VLLM::Worker_TP0) total-vm:1234kB",),
        F.oom,
        "Killed process",
        ("killed VLLM::Worker_TP0 (killed by SIGKILL)",),
    ),
    "earlyoom SIGTERM": Case(
        143,
        None,
        ('earlyoom: low memory! sending SIGTERM to process 2390 uid 0 "VLLM::Worker_TP0"',),
        F.oom,
        "earlyoom",
        ("earlyoom sent SIGTERM", "(killed by SIGTERM)"),
    ),
    "NV_ERR_NO_MEMORY with little MemAvailable is the cause": Case(
        1,
        None,
        (
            "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)",
            api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
        ),
        F.oom,
        "NV_ERR_NO_MEMORY",
        ("NVIDIA driver reported NV_ERR_NO_MEMORY, with 2.0 GiB MemAvailable (exit 1)",),
        ctx=ClassifyContext(mem_available_bytes=2 * 1024**3),
    ),
    "NV_ERR_NO_MEMORY with plenty of memory is startup noise": Case(
        0,
        None,
        (
            "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)",
            api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
        ),
        F.engine_dead,
        "died unexpectedly",
        ("engine core process EngineCore_DP0 died",),
        ctx=ClassifyContext(mem_available_bytes=60 * 1024**3),
    ),
    "NV_ERR_NO_MEMORY alone still explains a death": Case(
        1,
        None,
        ("NVRM: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051)",),
        F.oom,
        "NV_ERR",
    ),
    # ---- ports, GPU ----
    "TCPStore EADDRINUSE on the master port": Case(
        1,
        None,
        (w0(EADDRINUSE), api(ENGINE_INIT_FAILED)),
        F.port_in_use,
        "EADDRINUSE",
        ("The torch.distributed master port 29501 was already in use (exit 1)", "sweeps stale processes"),
        ctx=ClassifyContext(master_port=29501, api_port=8000),
    ),
    "older torch bind failure": Case(
        1,
        None,
        (
            "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29501 (errno: 98 - Address "
            "already in use).",
        ),
        F.port_in_use,
        "failed to bind",
        ("master port 29501",),
    ),
    "uvicorn cannot bind the API port": Case(
        1,
        None,
        (
            api(
                "[Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
                level="ERROR:   ",
                src="x",
            ),
        ),
        F.port_in_use,
        "8000",
        ("The API port 8000 was already in use",),
        ctx=ClassifyContext(api_port=8000),
    ),
    "bare Address already in use": Case(
        1,
        None,
        ("OSError: [Errno 98] Address already in use",),
        F.port_in_use,
        "Errno 98",
        ("A port vLLM needs was already in use",),
    ),
    "GPU busy from a stale process": Case(
        1,
        None,
        (w0("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"), api(ENGINE_INIT_FAILED)),
        F.gpu_busy,
        "busy or unavailable",
        ("stale vLLM process",),
    ),
    # ---- rendezvous and peers ----
    "head: rank 1 never joined": Case(
        1,
        None,
        (
            w0(
                "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined."
            ),
            api(ENGINE_INIT_FAILED),
        ),
        F.rendezvous_timeout,
        "1/2 clients joined",
        ("waited 601 s", "only 1/2 ranks arrived", "workers first"),
    ),
    "worker: cannot reach the head": Case(
        1,
        None,
        (
            RETRY,
            RETRY,
            "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
            "connect to (10.0.0.1, 29501).",
        ),
        F.rendezvous_timeout,
        "client socket has timed out",
        ("10.0.0.1:29501 for 600 s",),
    ),
    "worker killed while still retrying the rendezvous": Case(
        None,
        9,
        (RETRY, RETRY),
        F.rendezvous_timeout,
        "retrying",
        ("kept failing to reach the head's rendezvous at 10.0.0.1:29501 (killed by SIGKILL)",),
    ),
    "retries during a normal boot do not explain a later engine death": Case(
        0,
        None,
        (
            RETRY,
            w1("ERROR 11-26 01:30:00 [x.py:1] Worker proc VllmWorker-1 died unexpectedly, shutting down executor."),
        ),
        F.engine_dead,
        "VllmWorker-1",
    ),
    "headless worker: head went away": Case(
        None,
        15,
        (PEER_RECV, PEER_DUMP, PEER_RECV),
        F.peer_lost,
        "recvValue failed",
        ("The peer rank at 10.0.0.1 went away: its TCPStore connection closed (killed by SIGTERM)",),
        ctx=ClassifyContext(peer="10.0.0.1"),
    ),
    "peer lost before the NCCL error it caused": Case(
        1,
        None,
        (PEER_DUMP, "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"),
        F.peer_lost,
        "should dump",
    ),
    "NCCL remote process exited is a peer loss": Case(
        1,
        None,
        (w0("RuntimeError: NCCL error: remote process exited or there was a network error"),),
        F.peer_lost,
        "remote process exited",
        ("NCCL lost the peer rank",),
    ),
    # ---- NCCL ----
    "pynccl unhandled system error": Case(
        1,
        None,
        (
            w0("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
            ec("EngineCore encountered a fatal error."),
        ),
        F.nccl,
        "unhandled system error",
        ("NCCL failed: unhandled system error",),
    ),
    "torch DistBackendError": Case(
        1,
        None,
        (
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
            "version 2.27.3",
        ),
        F.nccl,
        "DistBackendError",
        ("NCCL failed: unhandled cuda error",),
    ),
    "RoCE memory registration failure": Case(
        1,
        None,
        ("spark-1:811:902 [0] NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory",),
        F.nccl,
        "ibv_reg_mr_iova2",
    ),
    "NCCL watchdog collective timeout": Case(
        None,
        6,
        (
            "[rank0]:[E1126 01:23:45 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600054 "
            "milliseconds before timing out.",
        ),
        F.nccl,
        "Watchdog caught",
        ("(killed by SIGABRT)",),
    ),
    # ---- wedges ----
    "TP wedge: shm waits, RPC timeout, engine death": Case(
        0,
        None,
        (
            ec(
                "No available shared memory broadcast block found in 60 seconds. This typically happens when "
                "some processes are hanging.",
                level="INFO",
            ),
            ec("No available shared memory broadcast block found in 60 seconds.", level="INFO"),
            ec("TimeoutError: RPC call to sample_tokens timed out."),
            ec("EngineCore encountered a fatal error."),
            api("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."),
            api("Application shutdown complete.", level="INFO"),
        ),
        F.hang,
        "RPC call to sample_tokens",
        ("the RPC call to sample_tokens timed out",),
    ),
    "engine ready timeout (0.33)": Case(
        1,
        None,
        (
            api(
                "TimeoutError: Timed out waiting for engine core processes to start. This is often caused by "
                "slow weight loading for large models. Waited 600s (configured by "
                "VLLM_ENGINE_READY_TIMEOUT_S)."
            ),
        ),
        F.hang,
        "Waited 600s",
        ("raise VLLM_ENGINE_READY_TIMEOUT_S",),
    ),
    # ---- engine death ----
    "V0's engine client finding its engine process gone": Case(
        1,
        None,
        ("ERROR 05-31 09:09:48 [client.py:305] RuntimeError('Engine process (pid 65262) died.')",
         "ERROR 05-31 09:09:48 [client.py:305] NoneType: None"),
        F.engine_dead,
        "Engine process (pid 65262) died",
        ("vLLM's engine died (its API server saw it go)",),
    ),
    "engine core died at runtime, exit 0": Case(
        0,
        None,
        (
            api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
            api("AsyncLLM output_handler failed."),
        ),
        F.engine_dead,
        "EngineCore_DP0 died",
        ("engine core process EngineCore_DP0 died (exit 0)",),
    ),
    "local worker died (0.33 wording)": Case(
        0,
        None,
        (
            ec("Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor."),
            ec("EngineCore encountered a fatal error."),
        ),
        F.engine_dead,
        "VllmWorker-0",
        ("worker process VllmWorker-0 died",),
    ),
    "init failed with no earlier cause in the tail": Case(
        1,
        None,
        (api(ENGINE_INIT_FAILED),),
        F.engine_dead,
        "Engine core initialization failed",
        ("no earlier cause is in the log tail",),
    ),
    "exit 0 after ready with nothing in the log is still engine death": Case(
        0,
        None,
        (api('10.0.0.5:43002 - "GET /health HTTP/1.1" 200 OK', level="INFO:    ", src="x"),),
        F.engine_dead,
        None,
        ("exited with status 0 without being asked to", "restarts every rank"),
        ctx=ClassifyContext(was_ready=True),
    ),
    "exit 0 before ready": Case(
        0,
        None,
        (),
        F.engine_dead,
        None,
        ("exited with status 0 before it was ready",),
        ctx=ClassifyContext(was_ready=False),
    ),
    # ---- nothing recognised ----
    "unknown non-zero exit keeps the last error-looking line": Case(
        1,
        None,
        (
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "UnboundLocalError: cannot access local variable 'w' where it is not associated with a value",
            "something after",
        ),
        F.unknown,
        "UnboundLocalError",
        ("vLLM stopped with an error sparkd does not recognise: `UnboundLocalError: cannot access local variable "
         "'w' where it is not associated with a value` (raised in x.<module>) (exit 1)",),
    ),
    "unknown SIGKILL from outside": Case(
        None,
        9,
        (),
        F.unknown,
        None,
        ("killed by SIGKILL from outside sparkd", "journalctl -k"),
    ),
    "exit 137 reads as SIGKILL": Case(137, None, (), F.unknown, None, ("killed by SIGKILL",)),
    "no exit status at all": Case(None, None, (), F.unknown, None, ("exit status is unknown",)),
    # ---- hints win ----
    "guard hint beats the OOM lines it caused": Case(
        None,
        9,
        (w0(TORCH_OOM),),
        F.killed_by_guard,
        "OutOfMemoryError",
        ("memory guard killed vLLM", "with 1.0 GiB MemAvailable (killed by SIGKILL)", "weigh extra"),
        hint=F.killed_by_guard,
        ctx=ClassifyContext(mem_available_bytes=1024**3),
    ),
    "probe said engine dead, log shows the death": Case(
        None,
        15,
        (api("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),),
        F.engine_dead,
        "died unexpectedly",
        ("engine core process EngineCore_DP0 died",),
        hint=F.engine_dead,
    ),
    "stall hint with a quiet log": Case(
        None,
        15,
        (),
        F.stall,
        None,
        ("stopped producing tokens", "(killed by SIGTERM)"),
        hint=F.stall,
    ),
    "hang hint overrides exit 127": Case(127, None, (), F.hang, None, ("stopped answering",), hint=F.hang),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_classify(case: Case) -> None:
    """Each observation gets its class, the line it rests on, and a sentence naming the facts."""
    failure = classify(case.exit_code, case.signal, case.tail, hint=case.hint, context=case.ctx)
    assert failure.cls is case.cls, failure.sentence
    if case.evidence_has is None:
        if case.cls not in (F.unknown, F.killed_by_guard):
            assert failure.evidence is None
    else:
        assert failure.evidence is not None and case.evidence_has in failure.evidence
    for part in case.sentence_has:
        assert part in failure.sentence, failure.sentence
    assert failure.sentence.endswith(".")
    assert "\x1b" not in (failure.evidence or "") and "pid=" not in (failure.evidence or "")
    assert failure.restartable is (case.cls not in (F.config_error, F.image_error))


def test_evidence_is_undecorated_and_exit_code_kept() -> None:
    """The evidence line has no colour and no process prefix; exit code and signal are reported back."""
    failure = classify(1, None, [api(ENGINE_INIT_FAILED), w0(FREE_MEM)])
    assert failure.evidence == f"ERROR 11-26 01:23:45 [multiproc_executor.py:727] {FREE_MEM}"
    assert (failure.exit_code, failure.signal) == (1, None)


def test_128_plus_n_exit_is_reported_as_signal() -> None:
    """Shells and docker exec report death by signal N as 128+N; the failure carries the signal."""
    failure = classify(137, None, [])
    assert (failure.exit_code, failure.signal) == (137, 9)


def test_earliest_cause_wins_within_a_tier() -> None:
    """Two specific causes: the first one logged is the root, the second is fallout."""
    tail = [w0(EADDRINUSE), w0(TORCH_OOM)]
    assert classify(1, None, tail).cls is F.port_in_use
    assert classify(1, None, list(reversed(tail))).cls is F.oom


def test_the_nccl_wrapper_yields_to_the_nccl_warn_line_it_wraps() -> None:
    """`NCCL error: unhandled system error` is generic; the NCCL WARN line says why, before or after it."""
    tail = ["RuntimeError: NCCL error: unhandled system error",
            "NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory"]
    for order in (tail, list(reversed(tail))):
        assert "ibv_reg_mr_iova2" in (classify(1, None, order).evidence or "")


def test_error_inside_a_tqdm_frame_is_found() -> None:
    """A cause printed into a line of tqdm `\\r` frames is still seen."""
    line = (
        "(Worker_TP0 pid=1) \rLoading safetensors checkpoint shards:  25% Completed | 1/4 [00:40<02:00]"
        f"\r{TORCH_OOM}\rLoading safetensors checkpoint shards:  25% Completed | 1/4 [00:41<02:01]"
    )
    assert classify(1, None, [line]).cls is F.oom


def test_only_the_tail_is_scanned() -> None:
    """Lines older than MAX_SCAN_LINES from the end are ignored (the noise differs line by line: the same line again
    and again is an engine going round without progress, cause.py's last resort)."""
    tail = [w0(FREE_MEM)] + [f"INFO 11-26 01:23:45 [x.py:1] noise {i}" for i in range(MAX_SCAN_LINES)]
    assert classify(1, None, tail).cls is F.unknown
    assert classify(1, None, [*tail[1:], w0(FREE_MEM)]).cls is F.free_memory_refusal


def test_long_evidence_is_truncated() -> None:
    """Evidence stays a readable line even when the log line is huge."""
    failure = classify(1, None, [TORCH_OOM + " x" * 2000])
    assert failure.evidence is not None and len(failure.evidence) <= 500


@pytest.mark.parametrize("cls", list(FailureClass), ids=str)
def test_every_class_has_a_sentence(cls: FailureClass) -> None:
    """A hint of any class yields one non-empty sentence saying what happened and what to do."""
    failure = classify(None, None, [], hint=cls)
    assert failure.cls is cls
    assert ";" in failure.sentence and failure.sentence.endswith(".")


def test_a_line_repeated_is_a_stall_only_when_nothing_else_is() -> None:
    """vLLM's engine logging one line again and again, word for word, with nothing else in the log, went round without
    progress; an idle engine's periodic stats and a request log repeat by nature and say nothing."""
    loop = ["INFO 02-03 11:27:41 [pool_scheduler.py:85] Reqid: r-382-0, Total tokens 1182, need to load: 1024"] * 6
    failure = classify(1, None, loop)
    assert failure.cls is F.stall and "Reqid: r-382-0" in failure.sentence, failure.sentence
    idle = ["INFO 11-26 01:23:45 [metrics.py:1] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
            "tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%"] * 6
    assert classify(None, 9, idle).cls is F.unknown
    assert classify(1, None, [*loop, api("ValueError: x must be divisible by tensor parallel size (3)")]).cls is \
        F.config_error
    # vLLM's front end waiting for its engine to start, again and again (held-out round 19): a start that hangs
    start = ["(APIServer pid=1) DEBUG 08-09 20:55:20 [v1/engine/utils.py:1262] Waiting for 1 local, 0 remote core "
             "engine proc(s) to start."] * 6
    stuck = classify(1, None, start)
    assert stuck.cls is F.hang and "the start is stuck" in stuck.sentence, stuck.sentence
