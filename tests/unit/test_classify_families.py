"""Classifier families, not strings (issue 25 §2, §3): an import that raises is an image error naming the module, an
exception while vLLM builds its config is a config error, every NCCL error token is nccl, the earliest cause wins over
what follows from it (issue 27's peer loss before a watchdog timeout), vLLM 0.32's engine-core lines, and a warning is
never the evidence."""

from __future__ import annotations

import signal

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.failures import FailureClass

F = FailureClass


def api(msg: str, level: str = "ERROR", src: str = "core.py:1") -> str:
    return f"(APIServer pid=780) {level} 11-27 09:10:23 [{src}] {msg}"


def ec(msg: str, level: str = "INFO", src: str = "core.py:1454") -> str:
    return f"(EngineCore pid=1108) {level} 11-27 09:16:15 [{src}] {msg}"


def traceback(frames: list[tuple[str, str, str]], exc: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, func, code in frames:
        lines += [f'  File "{path}", line 10, in {func}', f"    {code}"]
    return [*lines, exc]


SITE = "/usr/local/lib/python3.12/dist-packages"

# an exception at import, whatever its type: the module that failed to import is named
IMPORT_CASES = {
    "a RuntimeError in a package's module body": (traceback([
        (f"{SITE}/vllm/entrypoints/cli/main.py", "main", "import vllm.entrypoints.cli.benchmark.main"),
        (f"{SITE}/transformers/image_utils.py", "<module>", "from torchvision.io import ImageReadMode"),
        (f"{SITE}/torchvision/__init__.py", "<module>", "from torchvision import _meta_registrations"),
        (f"{SITE}/torchvision/_meta_registrations.py", "<module>", '@torch.library.register_fake("torchvision::nms")'),
        (f"{SITE}/torch/library.py", "impl", "if torch._C._dispatch_has_kernel_for_dispatch_key("),
    ], "RuntimeError: operator torchvision::nms does not exist"), "torchvision._meta_registrations"),
    "an OSError loading a library at import": (traceback([
        (f"{SITE}/vllm/__init__.py", "<module>", "from vllm.engine.arg_utils import EngineArgs"),
        (f"{SITE}/torchaudio/__init__.py", "<module>", "from torchaudio import _extension"),
        (f"{SITE}/torchaudio/_extension/utils.py", "_load_lib", "torch.ops.load_library(path)"),
    ], "OSError: libc10_cuda.so: cannot open shared object file: No such file or directory"), "libc10_cuda.so"),
    "a SyntaxError in an installed file": (traceback([
        (f"{SITE}/vllm/model_executor/models/registry.py", "load", "import vllm.model_executor.models.llama"),
        (f"{SITE}/vllm/model_executor/models/llama.py", "<module>", "from .utils import x"),
    ], "SyntaxError: invalid syntax"), "vllm.model_executor.models.llama"),
}


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_an_exception_while_importing_is_an_image_error_naming_it(case: str) -> None:
    lines, named = IMPORT_CASES[case]
    failure = classify(1, None, lines)
    assert failure.cls is F.image_error, failure.sentence
    assert named in failure.sentence and "will not retry an image error" in failure.sentence


def test_the_same_exception_outside_an_import_is_not_an_image_error() -> None:
    lines = traceback([
        ("<frozen runpy>", "_run_module_as_main", "return _run_code(code, main_globals, None,"),
        (f"{SITE}/vllm/entrypoints/openai/api_server.py", "<module>", "uvloop.run(run_server(args))"),
        (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", "execute_model", "return self.model(x)"),
    ], "RuntimeError: shape mismatch in the widget")
    # raised in the engine's step, not while a module imported: the engine's death, not the image's
    assert classify(1, None, lines).cls is F.engine_dead


CONFIG_CASES = {
    "verify_with_parallel_config": traceback([
        (f"{SITE}/vllm/engine/arg_utils.py", "create_engine_config", "config = VllmConfig("),
        (f"{SITE}/vllm/config/model.py", "verify_with_parallel_config", "raise ValueError("),
    ], "ValueError: Total number of attention heads (64) must be divisible by tensor parallel size (3)."),
    "a config module raising": traceback([
        (f"{SITE}/vllm/entrypoints/openai/api_server.py", "build_async_engine_client", "x = f()"),
        (f"{SITE}/vllm/config/cache.py", "_verify_cache_dtype", "raise ValueError(f'Unknown kv cache dtype')"),
    ], "ValueError: Unknown kv cache dtype fp7"),
    "not supported on the line": [api("ValueError: Chunked prefill is not supported for pooling models")],
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_an_exception_while_vllm_builds_its_config_is_a_config_error(case: str) -> None:
    failure = classify(1, None, CONFIG_CASES[case])
    assert failure.cls is F.config_error, failure.sentence
    assert "will not retry a config error" in failure.sentence


@pytest.mark.parametrize("line", [
    "node1:123:456 [0] NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-abc (size 9637888)",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, internal error - please report "
    "this issue to the NCCL developers, NCCL version 2.21.5 ncclInternalError: Internal check failed.",
    "RuntimeError: ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
    "RuntimeError: ncclUnhandledCudaError: Call to CUDA function failed.",
    "node1:1:2 [1] NCCL WARN Cuda failure 'out of memory'",
], ids=["WARN attach", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError", "WARN Cuda failure"])
def test_every_nccl_error_token_is_nccl(line: str) -> None:
    failure = classify(1, None, [line])
    assert failure.cls is F.nccl, failure.sentence
    assert "NCCL failed" in failure.sentence


RECV = ("[rank1]:[W1126 01:23:45.123456 811 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=41, "
        "addr=[::ffff:10.0.0.2]:51234, remote=[::ffff:10.0.0.1]:29501): Failed to recv, got 0 bytes. Connection was "
        "likely closed. Did the remote server shutdown or crash?")
WATCHDOG = ("[rank1]:[E1126 01:24:15.000000 811 ProcessGroupNCCL.cpp:685] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=15779, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=30000) "
            "ran for 30036 milliseconds before timing out.")


def test_a_peer_loss_before_the_watchdog_timeout_is_the_cause() -> None:
    """gpu-truth.md B3: the store closed 30 s before the watchdog fired; the timeout followed from it."""
    failure = classify(None, int(signal.SIGABRT), [RECV, WATCHDOG])
    assert failure.cls is F.peer_lost, failure.sentence
    assert "Watchdog caught collective operation timeout" in failure.sentence and "consequence" in failure.sentence
    assert failure.evidence == RECV


def test_a_watchdog_timeout_with_no_peer_loss_before_it_stays_nccl() -> None:
    """gpu-truth.md B2: the peer died silently (NVLink never notices); the lines after the timeout do not change it."""
    dump = ("[rank1]:[W1126 01:25:15.000000 811 ProcessGroupNCCL.cpp:1826] Failed to check the \"should dump\" flag "
            "on TCPStore, (maybe TCPStore server has shut down too early), with error: Connection reset by peer")
    assert classify(None, int(signal.SIGABRT), [WATCHDOG, dump]).cls is F.nccl


def test_vllm_032_engine_core_lines() -> None:
    died = classify(0, None, [api("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                                  "WARNING", "core_client.py:817")])
    assert died.cls is F.engine_dead and "engine core process exited unexpectedly" in died.sentence
    multi = classify(0, None, [api("Engine core process EngineCore_DP0 died unexpectedly.")])
    assert multi.cls is F.engine_dead and "EngineCore_DP0" in multi.sentence


def test_an_outside_sigterm_to_the_engine_core_is_named_and_vllms_own_is_not() -> None:
    outside = [ec("[shutdown] EngineCore: trigger received signal=SIGTERM"),
               api("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")]
    failure = classify(0, None, outside)
    assert failure.cls is F.engine_dead and "received SIGTERM from outside sparkd" in failure.sentence
    own = [api("[shutdown] API server: shutdown triggered", "INFO", "launcher.py:254"), *outside]
    assert "from outside sparkd and vLLM" not in classify(0, None, own).sentence
    crash = [api("Traceback (most recent call last):"), api("KeyError: 'x'"), *outside]
    assert "from outside sparkd and vLLM" not in classify(0, None, crash).sentence


def test_a_startup_warning_is_never_the_evidence_of_a_kill() -> None:
    """reviews/real-vllm.md h: an API-server SIGKILL's evidence was the ulimit WARNING quoting `OSError: [Errno 24]`."""
    warning = api("Found ulimit of 20000 and failed to automatically increase with error current limit exceeds "
                  "maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
                  "WARNING", "system_utils.py:255")
    failure = classify(None, int(signal.SIGKILL), [warning, api("Starting vLLM server on http://x", "INFO")])
    assert failure.cls is F.unknown and failure.evidence is None, failure.evidence


@pytest.mark.parametrize(("line", "named"), [
    ("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device",
     "not built for this GPU's architecture"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 12020). Please update your GPU "
     "driver", "does not match the host's NVIDIA driver"),
    ("RuntimeError: CUDA driver version is insufficient for CUDA runtime version",
     "does not match the host's NVIDIA driver"),
    ("OSError: /usr/local/lib/python3.12/dist-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa",
     "_C.abi3.so in the image was built against another torch or CUDA"),
    ("ImportError: libcudart.so.13: cannot open shared object file: No such file or directory",
     "cannot load the shared library libcudart.so.13"),
], ids=["no kernel image", "driver too old", "driver insufficient", "undefined symbol", "missing library"])
def test_image_errors_fail_fast_naming_what_is_missing(line: str, named: str) -> None:
    failure = classify(1, None, [api(line)])
    assert failure.cls is F.image_error and named in failure.sentence, failure.sentence
    assert not failure.restartable and "unknown" not in failure.sentence
