"""The classifier's evidence beyond the log tail (kernel lines, Docker's OOMKilled, MemAvailable), the cause it
names behind a generic consequence, and the image errors that fail fast. Real lines are in the corpus
(`tests/data/vllm-logs/`, test_vllm_corpus.py); these tables pin the mechanics."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import ClassifyContext, classify
from sparkd.supervisor.failures import TREATMENT, FailureClass

F = FailureClass
GIB = 1024**3

OOM_KILL = ("Out of memory: Killed process 4242 (VLLM::EngineCor) total-vm:99999999kB, anon-rss:1800000kB, "
            "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:9000kB oom_score_adj:500")
XID_79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
XID_31 = ("NVRM: Xid (PCI:000f:01:00): 31, pid=2301, name=VLLM::Worker_TP, Ch 00000008, intr 00000000. MMU Fault: "
          "ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_12345000. Fault is of type FAULT_PDE ACCESS_TYPE_READ")
NVRM = ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from "
        "_memdescAllocInternal(pMemDesc) @ mem_desc.c:1359")
NCCL = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
INIT_FAILED = ("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
               "proc(s): {'EngineCore_DP0': 1}")


def ec(message: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=2301) {level} 11-26 01:23:45 [core.py:866] {message}"


@pytest.mark.parametrize(
    ("exit_code", "sig", "tail", "ctx", "cls", "evidence", "says"),
    [
        pytest.param(None, 9, (), ClassifyContext(kernel_lines=(OOM_KILL,), mem_available_bytes=GIB), F.oom,
                     "Killed process 4242", ("The kernel OOM killer killed VLLM::EngineCor, with 1.0 GiB MemAvailable",
                                             "(killed by SIGKILL)"), id="kernel OOM kill explains a SIGKILL"),
        pytest.param(137, None, (), ClassifyContext(oom_killed=True), F.oom, "State.OOMKilled=true",
                     ("Docker reports the container was OOM-killed (killed by SIGKILL)",), id="docker OOMKilled"),
        pytest.param(1, None, (NCCL,), ClassifyContext(kernel_lines=(XID_79,)), F.gpu_error, "Xid (PCI:0000:44:00)",
                     ("reported Xid 79 (GPU has fallen off the bus)", "reboot or power-cycle"),
                     id="an Xid 79 is the root of the NCCL error after it"),
        pytest.param(1, None, (INIT_FAILED,), ClassifyContext(kernel_lines=(XID_31,)), F.gpu_error, "31, pid=2301",
                     ("Xid 31 (GPU memory page fault)", "a GPU kernel faulted"), id="an app Xid"),
        pytest.param(1, None, ("RuntimeError: CUDA error: an illegal memory access was encountered",),
                     ClassifyContext(kernel_lines=(XID_31,)), F.gpu_error, "illegal memory access",
                     ("A GPU kernel faulted (CUDA error: an illegal memory access was encountered)",),
                     id="the CUDA error in the log says more than the app Xid"),
        pytest.param(1, None, ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",),
                     ClassifyContext(kernel_lines=(XID_31,)), F.oom, "OutOfMemoryError", ("CUDA ran out of memory",),
                     id="an app Xid loses to a cause in the log"),
        pytest.param(None, 9, (), ClassifyContext(kernel_lines=(NVRM,), mem_available_bytes=2 * GIB), F.oom,
                     "NV_ERR_NO_MEMORY", ("NV_ERR_NO_MEMORY, with 2.0 GiB MemAvailable",), id="NVRM with low memory"),
        pytest.param(0, None, (), ClassifyContext(kernel_lines=(NVRM,), mem_available_bytes=60 * GIB), F.oom,
                     "NV_ERR_NO_MEMORY", (), id="NVRM with memory to spare is only the last resort"),
        pytest.param(None, 9, (), ClassifyContext(), F.unknown, None, ("from outside sparkd", "journalctl -k"),
                     id="SIGKILL with no kernel evidence"),
        pytest.param(None, 11, ("INFO 07-01 12:00:00 [core.py:100] step",), ClassifyContext(), F.unknown, None,
                     ("crashed with SIGSEGV", "not a kill from outside"), id="a segfault is a crash, not a kill"),
        pytest.param(134, None, (), ClassifyContext(), F.unknown, None, ("crashed with SIGABRT",),
                     id="exit 134 is an abort"),
        pytest.param(137, None, (), ClassifyContext(engine_gone=True), F.host_unavailable, None,
                     ("its container engine went away", "without spending the restart budget"),
                     id="a SIGKILL while the container engine stops is a wait"),
        pytest.param(1, None, (NCCL,), ClassifyContext(engine_gone=True), F.host_unavailable, "NCCL error",
                     ("its container engine went away",), id="whatever vLLM logged as its engine went away"),
    ],
)
def test_kernel_and_docker_evidence(exit_code: int | None, sig: int | None, tail: tuple[str, ...],
                                    ctx: ClassifyContext, cls: FailureClass, evidence: str | None,
                                    says: tuple[str, ...]) -> None:
    failure = classify(exit_code, sig, tail, context=ctx)
    assert failure.cls is cls, failure.sentence
    assert (failure.evidence is None) if evidence is None else (evidence in (failure.evidence or ""))
    for part in says:
        assert part in failure.sentence


def test_a_consequence_names_the_first_exception_before_it() -> None:
    """vLLM logs "EngineCore failed to start." and then the traceback; the first exception line is the cause."""
    tail = [
        ec("EngineCore failed to start."),
        ec("Traceback (most recent call last):"),
        ec('  File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 857, in run_engine_core'),
        ec("KeyError: 'expert_map'"),
        ec("Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
           "trace for root cause."),
        INIT_FAILED,
    ]
    failure = classify(1, None, tail)
    assert failure.cls is F.engine_dead
    assert failure.evidence == "KeyError: 'expert_map'"
    assert failure.sentence.startswith(
        "vLLM's engine failed to start; the first error in the log is `KeyError: 'expert_map'` (raised in "
        "vllm.v1.engine.core.run_engine_core) (exit 1); sparkd restarts")
    assert "no earlier cause" not in failure.sentence


def test_no_earlier_cause_only_when_there_is_none() -> None:
    failure = classify(1, None, [INIT_FAILED])
    assert "no earlier cause is in the log tail" in failure.sentence


def test_exit_0_names_the_first_exception() -> None:
    failure = classify(0, None, ["ValueError: something the classifier does not know"])
    assert failure.cls is F.engine_dead
    assert "the first error in the log is `ValueError: something the classifier does not know`" in failure.sentence


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("ModuleNotFoundError: No module named 'deep_gemm'", "lacks the Python module deep_gemm (DeepGEMM)"),
        ("ImportError: /usr/local/lib/python3.12/dist-packages/vllm/_C.abi3.so: undefined symbol: "
         "_ZN3c104cuda9SetDeviceEa", "_C.abi3.so in the image was built against another torch"),
        ("AttributeError: module 'cutlass.cute.nvgpu' has no attribute 'OperandMajorMode'",
         "The image's cutlass.cute.nvgpu has no attribute OperandMajorMode"),
        ("UnboundLocalError: local variable 'w13' referenced before assignment", "frees `w13` twice"),
        ("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
         "started without GPU access"),
    ],
)
def test_image_errors_fail_fast(line: str, says: str) -> None:
    """An image that lacks what vLLM imports fails the same way every launch: not restartable."""
    failure = classify(1, None, [ec(line), INIT_FAILED])
    assert failure.cls is F.image_error, failure.sentence
    assert says in failure.sentence and "will not retry an image error" in failure.sentence
    assert not failure.restartable and not TREATMENT[F.image_error].restartable


def test_an_import_logged_as_a_warning_is_no_image_error() -> None:
    """vLLM logs optional imports that fail as warnings; a never-retried class must not rest on one."""
    tail = [ec("ModuleNotFoundError: No module named 'triton_kernels'", level="WARNING"), INIT_FAILED]
    assert classify(1, None, tail).cls is F.engine_dead


@pytest.mark.parametrize(
    ("line", "free", "want"),
    [
        ("Free memory on device cuda:0 (4.75/119.67 GiB) is less than desired GPU memory utilization (0.9).",
         "4.75", "107.7"),
        ("ValueError: Free memory on device cuda:0 (~30/119.67 GiB) on startup is less than desired GPU memory "
         "utilization (0.9, 107.7 GiB)", "30", "107.7"),
    ],
    ids=["002 short form", "002 with a tilde"],
)
def test_free_memory_refusal_as_the_field_quotes_it(line: str, free: str, want: str) -> None:
    failure = classify(1, None, [line])
    assert failure.cls is F.free_memory_refusal
    assert f"only {free} of 119.67 GiB was free and it wants {want} GiB at gpu_memory_utilization 0.9" in (
        failure.sentence)


def test_rdma_enomem_names_memlock_ulimit_and_cap_ipc_lock() -> None:
    failure = classify(1, None, ["NCCL error: unhandled system error",
                                 "Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory"])
    assert failure.cls is F.nccl
    for word in ("memlock", "ulimit -l unlimited", "CAP_IPC_LOCK", "IPC_LOCK"):
        assert word in failure.sentence


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        ("[W1126 01:23:45.1 811 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=41): Connection reset "
         "by peer", F.peer_lost),
        ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the "
         "remote server shutdown or crash?", F.peer_lost),
        ("torch.distributed.DistStoreError: Socket Timeout", F.rendezvous_timeout),
        ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         F.peer_lost),
        ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:"
         "268, remote process exited or there was a network error, NCCL version 2.21.5", F.peer_lost),
        ("TimeoutError: Timed out waiting for engines to sendinitial message on input socket.", F.hang),
        ("AttributeError: 'ShmRingBuffer' object has no attribute 'shared_memory'", F.engine_dead),
        ("AssertionError: Error in memory profiling. Initial free memory 101.2 GiB, current free memory 104.8 GiB. "
         "This happens when other processes sharing the same container release GPU memory", F.free_memory_refusal),
    ],
    ids=["recvValue reset", "DistNetworkError alone", "DistStoreError", "ncclRemoteError", "torch NCCL error in",
         "0.13 sendinitial", "ShmRingBuffer", "memory profiling"],
)
def test_fidelity_m6_lines(line: str, cls: FailureClass) -> None:
    """The real strings reviews/fidelity.md M6 found ending as `unknown` or a less specific class."""
    failure = classify(1, None, [line])
    assert failure.cls is cls, failure.sentence


def test_shm_ring_sentence_names_fork_and_stays_restartable() -> None:
    """The fork flag caused it in 002; vllm#54259 shows the same line as an intermittent race: name both, retry."""
    failure = classify(1, None, ["AttributeError: 'ShmRingBuffer' object has no attribute 'shared_memory'",
                                 INIT_FAILED])
    assert "VLLM_WORKER_MULTIPROC_METHOD=fork" in failure.sentence and "vllm#54259" in failure.sentence
    assert failure.restartable


@pytest.mark.parametrize(
    ("line", "cls", "says"),
    [
        pytest.param("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'",
                     F.engine_dead,
                     ("custom all-reduce failed", "'invalid argument' at", "--disable-custom-all-reduce"),
                     id="vLLM's CUDACHECK in the custom all-reduce"),
        pytest.param("Failed: Cuda error /workspace/csrc/other.cu:12 'invalid configuration argument'",
                     F.engine_dead, ("A CUDA call in vLLM's kernels failed",), id="vLLM's CUDACHECK elsewhere"),
        # the error's code says what it is: a kernel that faulted on the device, whoever checked it
        pytest.param("Failed: Cuda error /workspace/csrc/other.cu:12 'an illegal instruction was encountered'",
                     F.gpu_error, ("The GPU reported a fault", "an illegal instruction"),
                     id="vLLM's CUDACHECK of a kernel fault"),
        pytest.param("RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable", F.gpu_busy,
                     ("busy or unavailable",), id="the older cudaErrorDevicesUnavailable wording"),
        pytest.param("host:454:604 [0] transport/net_ib.cc:937 NCCL WARN Call to ibv_modify_qp failed with 110 "
                     "Connection timed out, on dev rocep1s0f0:1, curr state INIT, next state RTR", F.nccl,
                     ("NCCL failed: Call to ibv_modify_qp failed with 110 Connection timed out",),
                     id="a failing verbs call"),
        pytest.param("vllm-decode-0:3663:4044 [0] misc/shmutils.cc:129 NCCL WARN Error while creating shared memory "
                     "segment /dev/shm/nccl-Ewjreo (size 33030528), error: No space left on device (28)", F.nccl,
                     ("segment /dev/shm/nccl-Ewjreo: /dev/shm is full", "shm_size"),
                     id="NCCL cannot create its /dev/shm segment (llm-d#352)"),
        pytest.param("ci:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE "
                     "to 9637892 bytes, error: No space left on device (28)", F.nccl,
                     ("segment /dev/shm/nccl-WU88OE: /dev/shm is full", "removes dead nccl-* segments"),
                     id="NCCL cannot grow its /dev/shm segment"),
        pytest.param("api_server.py: error: unrecognized arguments: /root/models/Qwen3-8B", F.config_error,
                     ("does not know the argument(s) /root/models/Qwen3-8B",), id="a stray positional argument"),
    ],
)
def test_rules_from_the_corpus(line: str, cls: FailureClass, says: tuple[str, ...]) -> None:
    failure = classify(1, None, (line,))
    assert failure.cls is cls, failure.sentence
    for part in says:
        assert part in failure.sentence, failure.sentence
