"""The gaps round 6's held-out misses showed (tests/data/heldout-misses.md), each as a general reading tested both ways
with lines of its own: a kernel's own assertion lines are the device-side assert even where CUDA's error after them is
cut, and no other assertion is; the driver that could not bring the GPUs up is the GPU's, its mismatch and its missing
device still the image's, and an INFO line naming the calls is nothing; ZMQ's and Winsock's words for EADDRINUSE are a
port taken, and a noun phrase is not; a listener whose writer says another process holds its port is a port taken, and
outranks the collective's timeout that follows it, while a listen failure without that reason, or memory or a device
another process uses, is not."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import classify
from sparkd.supervisor.events import read_events
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families import judge
from sparkd.supervisor.tracebacks import exception_line

F = FailureClass


def ec(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=7) {level} 01-02 03:04:05 [core.py:1] {msg}"


def _assert_line(thread: int) -> str:
    return (f"/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [91,0,0], thread: "
            f"[{thread},0,0] Assertion `srcIndex < srcSelectDimSize` failed.")


def test_a_kernels_assertion_lines_are_the_device_fault() -> None:
    """Repeated once per thread and cut before CUDA's `device-side assert triggered`, the lines are the fault; with
    CUDA's error after them, the first of them is still the cause it quotes."""
    cut = [_assert_line(t) for t in (32, 33, 34)]
    failure = classify(1, None, cut)
    assert failure.cls is F.gpu_error and "thread: [32,0,0]" in failure.sentence, failure.sentence
    whole = [*cut, ec("RuntimeError: CUDA error: device-side assert triggered")]
    failure = classify(1, None, whole)
    assert failure.cls is F.gpu_error and "indexSelectLargeIndex" in failure.sentence, failure.sentence


@pytest.mark.parametrize("line", [
    "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
    "python3: /src/csrc/ops.cpp:10: int run(): Assertion `n > 0' failed.",
    ec("AssertionError: Assertion `n > 0` failed."),
    ec("RuntimeError: block: [1,0,0] is not a valid launch shape"),
], ids=["torch's advice", "a host assertion (glibc)", "Python's AssertionError", "a launch shape"])
def test_no_other_assertion_is_the_devices(line: str) -> None:
    failure = classify(1, None, [line])
    assert failure.cls is not F.gpu_error, failure.sentence


@pytest.mark.parametrize(("line", "cls"), [
    (ec("Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() "
        "that might have already set an error? Error 802: system not yet initialized"), F.gpu_error),
    (ec("RuntimeError: Unexpected error from hipGetDeviceCount(). Did you run some cuda functions before calling "
        "NumHipDevices() that might have already set an error? Error 999: hipErrorUnknown"), F.gpu_error),
    (ec("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 804: forward compatibility was attempted on non "
        "supported HW"), F.image_error),
    (ec("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 100: no CUDA-capable device is detected"),
     F.image_error),
    ("host:1:1 [0] NCCL INFO cudaGetDeviceCount returned 2 devices", F.unknown),
    (ec("cuInit returned after 2.1 s, 8 devices", level="INFO"), F.unknown),
], ids=["802 logged without its type", "HIP's 999", "804: the image's CUDA and the driver", "100: no device",
        "NCCL's INFO", "an INFO line"])
def test_the_driver_that_could_not_bring_the_gpus_up(line: str, cls: FailureClass) -> None:
    failure = classify(1, None, [line])
    assert failure.cls is cls, failure.sentence


@pytest.mark.parametrize("line", [
    ec("ValueError: Address in use must be one of this host's addresses"),
    ec("ValueError: Free memory on device cuda:0 (22.35/23.56 GiB) on startup is less than desired GPU memory "
       "utilization (0.95, 22.38 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."),
    ec("RuntimeError: NPU 0 is being used by other process"),
    "[ERROR] HCCL(1,python3):2025-01-02-03:04:05.000.001 [hccl_socket.cc:100] [1][HcclSocket][Listen] socket type[1], "
    "listen on ip[10.0.0.3] and specific port[60001] fail.",
], ids=["a noun phrase", "memory other processes use", "a device another process uses", "a listen without a reason"])
def test_what_is_no_port_taken(line: str) -> None:
    hit = judge(read_events([line])[-1])
    assert hit is None or hit.cls is not F.port_in_use, hit


_LISTEN = ("[ERROR] HCCL(5,python3):2025-01-02-03:04:05.000.001 [hccl_socket.cc:100] [5][HcclSocket][Listen] socket "
           "type[1], listen on ip[10.0.0.3] and specific port[60001] fail. Please check the port status and whether "
           "the port is been using by other process.")
_TIMEOUT = ("[ERROR] HCCL(5,python3):2025-01-02-03:06:05.000.001 [hccl_socket_manager.cc:778] [6][Wait][LinkEstablish]"
            "wait socket establish timeout, role[1] rank[3] timeout[120]")


def test_a_port_taken_outranks_the_collective_timeout_after_it() -> None:
    """The link that rank should have served times out later: the collective library's timeout is the fallout of the
    port its listener could not have (a cause outranks its consequence), and alone it is still the library's."""
    failure = classify(1, None, [_LISTEN, _TIMEOUT])
    assert failure.cls is F.port_in_use and "Port 60001" in failure.sentence, failure.sentence
    assert classify(1, None, [_TIMEOUT]).cls is F.nccl


def test_an_exception_whose_head_was_cut_still_ends_its_traceback() -> None:
    """A title or a paste that cut a qualified type's module off (`.ZMQError` for `zmq.error.ZMQError`) leaves the
    exception line, not a line of source; a line of source under a frame stays one."""
    lines = ["Traceback (most recent call last):",
             '  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core_client.py", line 465, in __init__',
             "    self.input_socket = self.resources.input_socket",
             ".ZMQError: Address in use (addr='tcp://127.0.0.1:5570')"]
    failure = classify(1, None, lines)
    assert failure.cls is F.port_in_use and "Port 5570" in failure.sentence, failure.sentence
    assert exception_line("    .to(device)", in_traceback=True) is None
