"""The failure families (sparkd/supervisor/families.py), one table: every sign of every family with a case it decides
— an exception's type alone, where it was raised, an error code, the kind of line — and the class the whole
classifier gives for it. Adding a family is a row there and a case here (`test_every_sign_has_a_case`)."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families import BY_KIND, FAMILIES, Sign, judge

F = FailureClass
SITE = "/usr/local/lib/python3.12/dist-packages"


def tb(exc: str, *frames: tuple[str, ...]) -> list[str]:
    """A traceback through `frames` ((path under site-packages, function[, source line]), outermost first) ending in
    `exc`."""
    lines = ["Traceback (most recent call last):"]
    for path, func, *code in frames:
        lines += [f'  File "{SITE}/{path}", line 10, in {func}', f"    {code[0] if code else 'x = f()'}"]
    return [*lines, exc]


def ec(msg: str) -> str:
    return f"(EngineCore_DP0 pid=7) ERROR 01-02 03:04:05 [core.py:1] {msg}"


ENGINE_STEP = ("vllm/v1/engine/core.py", "step")
CONFIG = ("vllm/config/model.py", "__post_init__")
DIST_INIT = ("vllm/distributed/parallel_state.py", "init_distributed_environment")
RPC = ("vllm/distributed/device_communicators/shm_broadcast.py", "acquire_read")
DEVICE = ("torch/cuda/__init__.py", "_lazy_init")

# id → (log lines, the class). The id names the sign's point; a type alone is enough where it is specific.
CASES: dict[str, tuple[list[str], FailureClass]] = {
    "free memory: the startup check": ([ec("ValueError: Free memory on device xpu:0 (3.1/16.0 GiB) on startup is "
                                           "less than desired GPU memory utilization (0.9, 14.4 GiB).")],
                                       F.free_memory_refusal),
    "free memory: weights held outside": ([ec("ValueError: Externally held weights on device cuda:0 (90/120 GiB) "
                                              "exceed the desired GPU memory utilization (0.5, 60 GiB).")],
                                          F.free_memory_refusal),
    "free memory: profiling": ([ec("AssertionError: Error in memory profiling. Initial free memory 40.1 GiB, "
                                   "current free memory 52.3 GiB.")], F.free_memory_refusal),
    "port: ZMQ's words": ([ec("zmq.error.ZMQError: Address already in use (addr='tcp://*:5557')")], F.port_in_use),
    "gpu busy": ([ec("RuntimeError: HIP error: cudaErrorDevicesUnavailable")], F.gpu_busy),
    "peer: ncclRemoteError": ([ec("RuntimeError: ncclRemoteError: A call failed possibly due to a network error or "
                                  "a remote process exiting prematurely.")], F.peer_lost),
    "peer: Ray's node died (type alone)": (["ray.exceptions.NodeDiedError: node 7a1 is dead"], F.peer_lost),
    "peer: torch's store reset": (["[rank1]:[E1126 01:23:45.1 811 TCPStore.cpp:125] [c10d] failed to recv: "
                                   "Connection reset by peer"], F.peer_lost),
    "peer: torch.distributed raised it": (tb("torch.distributed.DistNetworkError: Connection reset by peer",
                                             ENGINE_STEP), F.peer_lost),
    "peer: Ray's node died": (["(raylet) A worker died or was killed: the node 10.0.0.2 has been marked dead "
                               "because the detector has missed too many heartbeats from it."], F.peer_lost),
    "rendezvous: Ray cannot place the ranks": ([ec("ValueError: Cannot provide a placement group of "
                                                   "placement_group_specs=[{'GPU': 1.0}] within 1800 seconds.")],
                                               F.rendezvous_timeout),
    "peer: Ray's GCS removed the node": (['{"label":"RAY_NODE_REMOVED","severity":"ERROR"}'], F.peer_lost),
    "rendezvous: Ray's autoscaler finds no node": (["(autoscaler +41s) Error: No available node types can fulfill "
                                                    "resource request {'GPU': 1.0}."], F.rendezvous_timeout),
    "rendezvous: DistStoreError alone": (["torch.distributed.DistStoreError: wait timeout after 300000ms, keys: "
                                          "/default_pg/0//cuda//0"], F.rendezvous_timeout),
    "rendezvous: Gloo's mesh": (["RuntimeError: Gloo connectFullMesh failed with [pair.cc:144] no error"],
                                F.rendezvous_timeout),
    "rendezvous: refused while the group forms": (tb("RuntimeError: Connection refused", DIST_INIT,
                                                     ("torch/distributed/rendezvous.py", "_create_c10d_store")),
                                                  F.rendezvous_timeout),
    "rendezvous: the NCCL id through the store": (["torch.distributed.DistBackendError: [1] is setting up NCCL "
                                                   "communicator and retrieving ncclUniqueId from [0] via c10d key-"
                                                   "value store by key '0', but store->get('0') got error: Socket "
                                                   "Timeout"], F.rendezvous_timeout),
    "nccl: DistBackendError alone": (["torch.distributed.DistBackendError: backend failure"], F.nccl),
    "nccl: an error code": ([ec("RuntimeError: ncclInvalidUsage: This usually reflects invalid usage of NCCL")],
                            F.nccl),
    "nccl: HCCL on Ascend": ([ec("RuntimeError: HCCL function error: HcclAllReduce(...), error code is 7")],
                             F.nccl),
    "nccl: HCCL by its function's name": ([ec("RuntimeError: OPS function error: HcclAllreduce, error code is 6")],
                                          F.nccl),
    "nccl: Ascend's EI code": (["        Get_Socket_Timeout(EI0006): Getting socket times out."], F.nccl),
    "nccl: vLLM's V0 wrapper": ([ec("RuntimeError: NCCL Error 3: internal error")], F.nccl),
    "nccl: a Bus error (/dev/shm)": (["(RayWorker pid=1) Fatal Python error: Bus error"], F.nccl),
    "nccl: a crash in NCCL's proxy": (["(RayWorkerWrapper pid=2, ip=10.0.0.2) PC: @     0x7fcfcd849b8a  (unknown)  "
                                       "addProxyOpIfNeeded()"], F.nccl),
    "nccl: ProcessGroupNCCL gave up": ([ec("RuntimeError: Some NCCL operations have failed or timed out. Due to the "
                                           "asynchronous nature of CUDA kernels ...")], F.nccl),
    "oom: the type alone": (tb("torch.OutOfMemoryError", ENGINE_STEP), F.oom),
    "oom: an NPU's wording": ([ec("RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB")], F.oom),
    "oom: an error code": ([ec("RuntimeError: hipErrorOutOfMemory")], F.oom),
    "oom: the host's allocator": ([ec("RuntimeError: [enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't "
                                      "allocate memory: you tried to allocate 4398046511104 bytes.")], F.oom),
    "oom: vLLM while loading": ([ec("Failed to load model - not enough GPU memory.")], F.oom),
    "oom: Gaudi": ([ec("RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 "
                       "(1024)MB")], F.oom),
    "oom: Ray's memory monitor": (["ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
                                   "memory."], F.oom),
    "oom: Ray's monitor killed an actor": (["ray.exceptions.ActorDiedError: The actor died unexpectedly: the worker "
                                            "was killed by the memory monitor because the node was low on memory."],
                                           F.oom),
    "oom: Kubernetes": (["    Reason:       OOMKilled"], F.oom),
    "image: raised while importing": (tb("RuntimeError: CUDA version mismatch",
                                         ("vllm/__init__.py", "<module>", "import flash_attn"),
                                         ("flash_attn/__init__.py", "<module>")), F.image_error),
    "image: ImportError alone": (tb("ImportError", ENGINE_STEP), F.image_error),
    "image: Python's bare words": (["(TemporaryActor pid=1495807) No module named 'vllm'"], F.image_error),
    "image: an instruction the CPU lacks": (["run.sh: line 18:  1669 Illegal instruction     (core dumped) python -m "
                                             "vllm.entrypoints.openai.api_server"], F.image_error),
    "image: undefined symbol": ([ec("OSError: /x/_C.so: undefined symbol: _ZN3c10")], F.image_error),
    "image: module attribute": ([ec("AttributeError: module 'triton.language' has no attribute 'fp8e4nv'")],
                                F.image_error),
    "image: no platform vLLM knows": (tb("RuntimeError: Failed to infer device type", CONFIG), F.image_error),
    "image: Triton's ptxas": (["triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error"],
                              F.image_error),
    "image: no supported architecture (FlashInfer)": ([ec("RuntimeError: No supported CUDA architectures found for "
                                                         "major versions [10].")], F.image_error),
    "image: not built for the architecture": ([ec("RuntimeError: HIP error: invalid device function")],
                                              F.image_error),
    "image: driver too old": ([ec("RuntimeError: CUDA driver version is insufficient for CUDA runtime version")],
                              F.image_error),
    "image: the container runtime's check": (["nvidia-container-cli: requirement error: unsatisfied condition: "
                                              "cuda>=12.4, please update your driver to a newer version"],
                                             F.image_error),
    "image: CPU torch": ([ec("AssertionError: Torch not compiled with CUDA enabled")], F.image_error),
    "config: raised while building the config": (tb("KeyError: 'rope_type'", ("vllm/engine/arg_utils.py",
                                                                              "create_engine_config"), CONFIG),
                                                 F.config_error),
    "config: pydantic on a config class": (["pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                            "SchedulerConfig"], F.config_error),
    "config: Hugging Face says no repo": (["huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error."],
                                          F.config_error),
    "config: not a model": ([ec("OSError: /models/x is not a local folder and is not a valid model identifier")],
                            F.config_error),
    "config: the KV cache comes out negative": ([ec("ValueError: ... (12.00 GiB KV cache is needed, which is larger "
                                                    "than the available KV cache memory (-3.20 GiB).")],
                                                F.config_error),
    "config: another build's error line": (["ERROR 2025-07-21 14:34:24.934 factory.py:62] Bfloat16 is only supported "
                                            "on GPUs with compute capability of at least 8.0."], F.config_error),
    "config: a value the GPU cannot take": ([ec("ValueError: Bfloat16 is only supported on GPUs with compute "
                                                "capability of at least 8.0.")], F.config_error),
    "config: more GPUs than there are": ([ec("RuntimeError: CUDA error: invalid device ordinal")], F.config_error),
    "config: remote code not allowed": ([ec("ValueError: Loading x requires you to execute the configuration file "
                                            "in that repo on your local machine. Set the option "
                                            "`trust_remote_code=True` to remove this error.")], F.config_error),
    "gpu: a kernel faulted (ROCm)": (["Memory access fault by GPU node-1 (Agent handle: 0x5) on address 0x7f. "
                                      "Reason: Page not present or supervisor privilege."], F.gpu_error),
    "gpu: ECC": ([ec("RuntimeError: CUDA error: uncorrectable ECC error encountered")], F.gpu_error),
    "gpu: CUDA cannot initialise the device": (tb("RuntimeError: Unexpected error from cudaGetDeviceCount(). Error "
                                                  "802: system not yet initialized", DEVICE), F.gpu_error),
    "hang: the executor's wait ran out": (tb("TimeoutError", RPC), F.hang),
    "hang: Ray's channel (type alone)": (["ray.exceptions.RayChannelTimeoutError: System error: Timed out waiting "
                                          "for object available to read."], F.hang),
    "engine dead: Ray's actor died (type alone)": (["ray.exceptions.ActorDiedError: The actor died unexpectedly "
                                                    "before finishing this task."], F.engine_dead),
    "engine dead: V0's wording (type alone)": ([ec("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background "
                                                   "loop has errored already.")], F.engine_dead),
    "by kind: an NCCL WARN": (["host:1:2 [0] NCCL WARN NET/IB : Got async event : port error"], F.nccl),
    "by kind: ProcessGroupNCCL's error line": (["[rank0]:[E1126 01:23:45.1 811 ProcessGroupNCCL.cpp:1} [PG 0] "
                                                "process group watchdog thread terminated with exception"], F.nccl),
    "by kind: a CUDA error no family names": ([ec("RuntimeError: CUDA error: operation not supported")],
                                              F.gpu_error),
}


def _deciding(lines: list[str]) -> Sign | None:
    """The sign that decided the last line with a verdict of its own."""
    hits = [judge(event) for event in read_events(lines)]
    found = [hit for hit in hits if hit is not None]
    return found[-1].sign if found else None


@pytest.mark.parametrize("case", list(CASES))
def test_each_family_by_what_the_failure_is(case: str) -> None:
    lines, cls = CASES[case]
    failure = classify(1, None, lines)
    assert failure.cls is cls, failure.sentence
    said = (failure.evidence or "").split(": ", 1)[-1][:30]
    if cls is not F.engine_dead:  # a consequence alone has no cause to quote
        assert "`" in failure.sentence or said in failure.sentence, f"the sentence quotes no line: {failure.sentence}"


def test_every_sign_has_a_case() -> None:
    """Each sign of the table (and of the fallback by kind) decides at least one case above, with its reason."""
    decided = {id(_deciding(lines)) for lines, _ in CASES.values()}
    signs = [(family.cls.value, s) for table in (FAMILIES, BY_KIND) for family in table for s in family.signs]
    untested = [f"{cls}: {s.reason}" for cls, s in signs if id(s) not in decided]
    assert not untested, untested
    assert all(len(s.reason) > 20 for _, s in signs)


@pytest.mark.parametrize(("line", "why"), [
    ("(APIServer pid=1) ERROR 01-02 03:04:05 [x.py:1] ConnectionResetError: [Errno 104] Connection reset by peer",
     "an HTTP client's reset is no rank's"),
    ("(APIServer pid=1) WARNING 01-02 03:04:05 [x.py:1] ImportError: No module named 'flash_attn' (optional)",
     "a warning is never the evidence"),
], ids=["client reset", "warning"])
def test_what_no_family_claims(line: str, why: str) -> None:
    assert judge(read_events([line])[0]) is None, why


def test_a_stop_is_no_family() -> None:
    """A Ctrl-C while vLLM builds its config says how the process stopped, not that the config is wrong; the worker's
    death by the SIGTERM that follows is the stop's fallout."""
    lines = tb("KeyboardInterrupt", CONFIG)
    assert judge(read_events(lines)[-1]) is None
    assert classify(None, 2, lines).cls is F.unknown
    worker = "ERROR 08-17 23:28:45 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 12 died, exit code: -15"
    failure = classify(None, 2, [*lines, worker])
    assert failure.cls is F.unknown and "KeyboardInterrupt" in failure.sentence, failure.sentence


@pytest.mark.parametrize(("line", "cls", "says"), [
    ("INFO 09-18 16:11:03 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
     "tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 22 reqs, GPU KV cache usage: 0.0%", F.stall,
     "22 request(s) waiting, none scheduled"),
    ("(Worker_TP2 pid=554) INFO 10-28 21:14:48 [worker_v1.py:259] Available memory: 0, total memory: 65452113920",
     F.config_error, "leave 0 for the KV cache"),
    ("INFO 12-23 23:34:20 [gpu_worker.py:298] Available KV cache memory: -2.77 GiB", F.config_error,
     "leave -2.77 GiB for the KV cache"),
], ids=["a queue nothing takes", "no memory left for the KV cache", "a negative KV cache"])
def test_lines_below_error_that_still_say_why(line: str, cls: FailureClass, says: str) -> None:
    """A few INFO lines state a failure outright (rules.py reads them; a family never reads below ERROR)."""
    failure = classify(1, None, [line])
    assert failure.cls is cls and says in failure.sentence, failure.sentence


def test_a_line_of_source_is_no_evidence() -> None:
    """The source line Python prints under a frame says what runs, not what failed."""
    lines = ["Traceback (most recent call last):", f'  File "{SITE}/vllm/platforms/__init__.py", line 9, in resolve',
             '    raise RuntimeError("CUDA error: out of memory")', "RuntimeError: shape mismatch"]
    assert classify(1, None, lines).cls is F.unknown


def test_an_abort_is_explained_by_the_watchdog_after_it() -> None:
    """A worker that died of SIGABRT was aborted by NCCL's watchdog, whose timeout may be logged after the death."""
    lines = ["ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 1159 died, "
             "exit code: -6",
             "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=2, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."]
    assert classify(1, None, lines).cls is F.nccl
    assert classify(1, None, [lines[0].replace("-6", "-11"), lines[1]]).cls is F.engine_dead


def test_an_unknown_still_says_what_happened() -> None:
    """No family, no rule: the sentence names the chain's root exception, where it was raised, and vLLM's last error
    line when it says something else; with no exception at all, vLLM's first error line."""
    lines = [*tb("KeyError: 'model.layers.0.mlp.gate.weight'", ("vllm/model_executor/models/llama.py", "load_weights")),
             "", "The above exception was the direct cause of the following exception:", "",
             *tb("RuntimeError: weights did not load", ENGINE_STEP),
             ec("Engine step failed; requests aborted")]
    failure = classify(1, None, lines)
    assert failure.cls is F.unknown, failure.sentence
    assert "`KeyError: 'model.layers.0.mlp.gate.weight'` (raised in vllm.model_executor.models.llama.load_weights)" \
        in failure.sentence, failure.sentence
    assert "vLLM's last error line is `Engine step failed; requests aborted`" in failure.sentence
    bare = classify(1, None, [ec("    halGetDeviceInfo failed, ret:87"), ec("    ctx is NULL!")])
    assert bare.cls is F.unknown and "the first error vLLM logged is `halGetDeviceInfo failed, ret:87`" in bare.sentence
