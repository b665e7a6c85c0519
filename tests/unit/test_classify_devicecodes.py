"""The device runtimes' numbered errors, read by their vendors' catalogues (`devicecodes.py`, issue 39): every code of
every group is read as its group says (NVIDIA's Xid, CUDA's numbers, Ascend's ACL_ERROR_RT_ codes), the driver's
recovery action (Xid 154) says what the GPU needs after the fault's Xid, a code no group lists names no class, a
kernel line pasted without its host is still the kernel's, and a GPU runtime that fails to load is the image's."""

from __future__ import annotations

import pytest

from sparkd.supervisor.classify import ClassifyContext, classify
from sparkd.supervisor.devicecodes import ACL_GROUPS, CUDA_GROUPS, XID_GROUPS, CodeGroup
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.sentences import APP_XID_DO, REBOOT_DO

F = FailureClass


def ec(msg: str, level: str = "ERROR") -> str:
    return f"(EngineCore_DP0 pid=702) {level} 09-04 09:50:12 [core.py:702] {msg}"


def _cases(groups: tuple[CodeGroup, ...]) -> list[tuple[int, CodeGroup]]:
    return [(code, g) for g in groups for code in g.codes]


# ---- Xid --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "group"), _cases(XID_GROUPS), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_every_xid_of_the_catalogue_is_read_by_its_group(code: int, group: CodeGroup) -> None:
    line = f"NVRM: Xid (PCI:0000:01:00): {code}, pid=12542, name=VLLM::Worker, details"
    failure = classify(1, None, [], context=ClassifyContext(kernel_lines=(line,)))
    assert failure.cls is F.gpu_error and f"Xid {code} ({group.codes[code]})" in failure.sentence, failure.sentence
    assert (REBOOT_DO if group.do == REBOOT_DO else APP_XID_DO) in failure.sentence


XID_62 = "NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342"
PMU = "NVRM: GPU0 _kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted."
XID_13 = "NVRM: Xid (PCI:0000:01:00): 13, pid=99, name=python3, Graphics Exception: ESR 0x52e7b0=0x101000e"


def _recovery(old: str, new: str) -> str:
    return f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from {old} to {new}"


@pytest.mark.parametrize(("kernel", "named", "do"), [
    pytest.param((XID_62, PMU, _recovery("0x0 (None)", "0x1 (GPU Reset Required)")),
                 "needs a GPU reset (GPU Reset Required, Xid 154", REBOOT_DO,
                 id="a reset after a firmware halt: the recovery action is the cause, quoted"),
    pytest.param((XID_13, _recovery("0x0 (None)", "0x2 (Node Reboot Required)")),
                 "needs a node reboot (Node Reboot Required, Xid 154", REBOOT_DO,
                 id="a reboot after a program's fault: the driver says the GPU itself needs it"),
    pytest.param((XID_13, _recovery("0x1 (GPU Reset Required)", "0x0 (None)")), "Xid 13 (graphics engine exception)",
                 APP_XID_DO, id="an action of none is no fault: the program's Xid stays the reading"),
])
def test_the_drivers_recovery_action_says_what_the_gpu_needs(kernel: tuple[str, ...], named: str, do: str) -> None:
    failure = classify(1, None, [], context=ClassifyContext(kernel_lines=kernel))
    assert failure.cls is F.gpu_error and named in failure.sentence and do in failure.sentence, failure.sentence
    if "Xid 154" in named:
        assert kernel[-1].removeprefix("NVRM: ") in failure.sentence


@pytest.mark.parametrize("prefix", ["Mar 27 17:40:36 kernel: ", "Mar 27 17:40:36 gpu-host-3 kernel: ",
                                    "Mar  7 17:40:36 kernel: "])
def test_a_kernel_line_in_the_tail_is_the_kernels_with_or_without_its_host(prefix: str) -> None:
    failure = classify(1, None, [f"{prefix}{XID_62}"])
    assert failure.cls is F.gpu_error and "Xid 62 (internal micro-controller halt)" in failure.sentence, \
        failure.sentence


# ---- CUDA's numbered errors ----------------------------------------------------------------------------------------

CUDA_FORMS = ["RuntimeError: ... err {code} != CUDA_SUCCESS :: CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
              "RuntimeError: CUDA error {code} in the attention kernel", "cuDNN returned error code {code}",
              "RuntimeError: CUDA driver error: {code}"]


@pytest.mark.parametrize(("code", "group"), _cases(CUDA_GROUPS), ids=lambda v: str(v) if isinstance(v, int) else "")
@pytest.mark.parametrize("form", CUDA_FORMS)
def test_every_cuda_number_of_a_fault_is_the_gpus(code: int, group: CodeGroup, form: str) -> None:
    failure = classify(1, None, [ec(form.format(code=code))])
    assert failure.cls is F.gpu_error and f"CUDA error {code}" in failure.sentence, failure.sentence
    assert group.do is not None and group.do in failure.sentence


@pytest.mark.parametrize("line", [
    "RuntimeError: the parser stopped: err 715 at offset 12",  # no CUDA name: not CUDA's number
    "RuntimeError: CUDA error 7150 in the attention kernel",  # another number
    "RuntimeError: CUDA graph of 700 tokens failed to replay",  # a count, not an error's number
])
def test_a_number_that_is_not_cudas_error_is_no_fault(line: str) -> None:
    failure = classify(1, None, [ec(line)])
    assert "A GPU kernel faulted (CUDA error" not in failure.sentence, failure.sentence


# ---- Ascend's runtime codes ----------------------------------------------------------------------------------------

ACL_FORMS = ["RuntimeError: ACL stream synchronize failed, error code:{code}",
             "RuntimeError: Worker failed with error 'ACL stream synchronize failed, error code:{code}', please check "
             "the stack trace above for the root cause",
             "rtKernelLaunchWithHandleV2 failed: {code}",
             "RuntimeError: synchronize:torch_npu/csrc/core/npu/NPUStream.cpp:1 NPU function error: "
             "c10_npu::acl::AclrtSynchronizeStreamWithTimeout(stream()), error code is {code}"]


@pytest.mark.parametrize(("code", "group"), _cases(ACL_GROUPS), ids=lambda v: str(v) if isinstance(v, int) else "")
@pytest.mark.parametrize("form", ACL_FORMS)
def test_every_ascend_code_of_a_group_is_read_as_the_group_says(code: int, group: CodeGroup, form: str) -> None:
    failure = classify(1, None, [ec(form.format(code=code))])
    name = group.codes[code].partition(":")[0]
    assert failure.cls is group.cls and f"ACL_ERROR_RT_{name}, error {code}" in failure.sentence, failure.sentence


def test_the_quote_of_a_code_deep_in_a_long_line_begins_at_the_call_that_failed() -> None:
    """torch_npu's long lines put the code after the failing call: the quote keeps the call (a clause break just before
    `error code` would leave `…error code is 507048` alone)."""
    long_line = ("RuntimeError: Worker failed with error 'operator():build/CMakeFiles/torch_npu.dir/compiler_depend.ts"
                 ":47 NPU function error: c10_npu::acl::AclrtSynchronizeStreamWithTimeout(copy_stream), error code is "
                 "507048")
    failure = classify(1, None, [ec(long_line)])
    assert "AclrtSynchronizeStreamWithTimeout(copy_stream), error code is 507048" in failure.sentence, failure.sentence


@pytest.mark.parametrize(("code", "group"), _cases(ACL_GROUPS), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_an_ascend_code_is_read_by_its_name_too(code: int, group: CodeGroup) -> None:
    name = group.codes[code].partition(":")[0]
    failure = classify(1, None, [ec(f"RuntimeError: the kernel failed: ACL_ERROR_RT_{name}")])
    assert failure.cls is group.cls and f"ACL_ERROR_RT_{name}" in failure.sentence, failure.sentence


@pytest.mark.parametrize("line", [
    "RuntimeError: NPU function error: c10_npu::acl::AclrtSynchronizeStreamWithTimeout(stream()), error code is "
    "507011",  # ACL_ERROR_RT_MODEL_EXECUTE: the execution failed, not why
    "RuntimeError: NPU function error: c10_npu::SetDevice(device_id_), error code is 507033",  # device setup error
    "[ERROR] 2025-07-01-08:38:50 (PID:507035, Device:0, RankID:1) ERR00100 PTA call acl api failed",  # a pid
])
def test_an_ascend_code_no_group_lists_names_no_class(line: str) -> None:
    failure = classify(1, None, [ec(line)])
    assert failure.cls is F.unknown and "ACL_ERROR_RT_" not in failure.sentence, failure.sentence


# ---- a GPU runtime that fails to load --------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "runtime"), [
    ("hip runtime failed to load.", "hip"),
    ("RuntimeError: CUDA driver library could not be loaded", "CUDA"),
    ("RuntimeError: Failed to load the HIP runtime", "HIP"),
    ("ROCm runtime failed to load: no usable device", "ROCm"),
])
def test_a_gpu_runtime_that_fails_to_load_is_the_images(line: str, runtime: str) -> None:
    failure = classify(1, None, [ec(line)])
    assert failure.cls is F.image_error and f"The GPU runtime ({runtime}) failed to load" in failure.sentence, \
        failure.sentence


@pytest.mark.parametrize("line", [ec("hip runtime failed to load.", level="WARNING"),
                                  ec("RuntimeError: failed to load model weights from the HIP cache")])
def test_a_warning_or_another_thing_failing_to_load_is_not_a_runtime_that_failed(line: str) -> None:
    assert classify(1, None, [line]).cls is not F.image_error
