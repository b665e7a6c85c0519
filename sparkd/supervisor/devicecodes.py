"""The device runtimes' numbered errors, read by their vendors' catalogues: a code says what failed, and the group it
belongs to says which class that is and why. Pure.

- NVIDIA's Xid (the kernel driver's `NVRM: Xid (PCI:…): N, …`), by NVIDIA's Xid catalogue ("Xid Errors", its
  resolution buckets): the codes whose immediate action is to restart the application are faults a program's kernel
  can cause (an illegal address, an engine exception) and leave the GPU usable; Xid 45 is the driver cleaning up a
  channel after an earlier error (a consequence); every other code is the device, its memory, its link or its
  firmware, and wants a reset. Xid 154 is no fault of its own: it reports the driver's recovery action for the GPU
  (NVML's `nvmlDeviceGpuRecoveryAction_t`), which is what the node now needs.
- CUDA's numbered errors, where a log gives only the number (`err 715 != CUDA_SUCCESS`, `CUDA error 700`):
  `cudaError_t` and the driver's `CUresult` share these numbers, and the family reads their names the same way.
- Ascend's runtime codes (CANN's `rt_error_codes.h`, `ACL_ERROR_RT_*`) by their number or their name: its rule 4 puts
  device execution failures in 5xxxxx, rule 2 resources (memory) in 2xxxxx.

A code no group lists says only that the runtime failed (Ascend's 507011 `model execute failed`, 507000 `internal
error`, 507033 `device setup error`): it names no class, and the other readings (the exception, the words) decide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.familykit import Sign, sign
from sparkd.supervisor.rulekit import Tier, What
from sparkd.supervisor.sentences import APP_XID_DO, REBOOT_DO

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sparkd.supervisor.context import ClassifyContext
    from sparkd.supervisor.events import Kind

__all__ = [
    "ACL_GROUPS",
    "CUDA_GROUPS",
    "XID_GROUPS",
    "XID_RECOVERY",
    "CodeGroup",
    "acl_code_pattern",
    "code_signs",
    "code_what",
    "cuda_code_pattern",
    "xid_app_fault",
    "xid_fatal",
    "xid_recovery_needed",
    "xid_recovery_what",
    "xid_what",
]

F = FailureClass

DEVICE_KERNEL_DO = ("a kernel (an operator) faulted on the device, usually a bug in vLLM, its platform plugin or a "
                    "kernel for this model and settings — sparkd restarts with backoff; if it repeats, change the "
                    "kernel backend or the build")
NPU_RESET_DO = ("the device's firmware or its DMA failed: check the NPU (`npu-smi info`) and the host's log, then "
                "reset the device or reboot the node — sparkd restarts with backoff and stops at the restart breaker")


@dataclass(frozen=True)
class CodeGroup:
    """Codes of one runtime that mean one thing: their class, tier and what to do, and why (`reason`)."""

    cls: FailureClass
    tier: Tier
    reason: str
    codes: Mapping[int, str]  # the code → its meaning (Ascend: its ACL_ERROR_RT_ name's tail, then its meaning)
    do: str | None = None
    says: str = ""  # the "what happened" of a code of a runtime's group, from {code}, {name} and {meaning}


def _codes(table: dict[int, str]) -> Mapping[int, str]:
    return MappingProxyType(table)


# ---- Xid (NVIDIA's Xid catalogue) ------------------------------------------------------------------------------

XID_PROGRAM = CodeGroup(F.gpu_error, Tier.GENERIC, "the catalogue's immediate action is RESTART_APP: a fault a "
                        "program's kernel can cause (an illegal address, an engine or class exception, a channel that "
                        "stopped); the GPU itself is fine, and a specific cause in vLLM's log says more",
                        _codes({13: "graphics engine exception", 31: "GPU memory page fault",
                                32: "corrupted push buffer stream", 43: "GPU stopped processing",
                                68: "video processor exception", 69: "graphics engine class error"}), APP_XID_DO)
XID_CONSEQUENCE = CodeGroup(F.gpu_error, Tier.GENERIC, "preemptive cleanup, due to previous errors: the driver tore "
                            "down a process's channels after a fault or the process's end; it follows a cause",
                            _codes({45: "preemptive cleanup after a process ended"}), APP_XID_DO)
XID_DEVICE = CodeGroup(F.gpu_error, Tier.CAUSE, "the device, its memory (ECC, row remapping), its NVLink or C2C link, "
                       "the PCIe bus or its firmware (the GSP, the PMU and other micro-controllers): the catalogue's "
                       "immediate action is a GPU reset or a reboot; a code it does not list is read so too",
                       _codes({48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
                               62: "internal micro-controller halt", 63: "ECC page retirement or row remap",
                               64: "ECC page retirement or row remap failure", 74: "NVLink error",
                               79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
                               94: "contained ECC error", 95: "uncontained ECC error", 109: "context switch timeout",
                               119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error",
                               140: "unrecovered ECC error", 143: "GPU initialization failure"}), REBOOT_DO)
# Xid 154: the driver's recovery action for the GPU, NVML's nvmlDeviceGpuRecoveryAction_t (0 none: the GPU is usable
# again). Any other action is what the node needs now, and says more than the fault's Xid before it.
XID_RECOVERY = 154
_RECOVERY_ACTIONS = _codes({1: "a GPU reset", 2: "a node reboot", 3: "its peer-to-peer traffic drained",
                            4: "its peer-to-peer traffic drained and a GPU reset", 5: "its IMEX domain recovered",
                            6: "a reset of its PCIe bus", 7: "a system reboot"})
XID_GROUPS = (XID_PROGRAM, XID_CONSEQUENCE, XID_DEVICE)


def _xid(m: re.Match[str]) -> int:
    return int(m.group("xid"))


def _xid_group(xid: int) -> CodeGroup:
    return next((g for g in XID_GROUPS if xid in g.codes), XID_DEVICE)


def xid_what(m: re.Match[str], ctx: ClassifyContext) -> str:
    xid = _xid(m)
    meaning = _xid_group(xid).codes.get(xid)
    detail = f" ({meaning})" if meaning else ""
    return f"The GPU at PCI {m.group('pci').removeprefix('PCI:')} reported Xid {xid}{detail}"


def xid_fatal(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return _xid(m) != XID_RECOVERY and _xid_group(_xid(m)).tier is Tier.CAUSE


def xid_app_fault(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return _xid(m) != XID_RECOVERY and _xid_group(_xid(m)).tier is Tier.GENERIC


def xid_recovery_needed(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return int(m.group("action"), 16) != 0


def xid_recovery_what(m: re.Match[str], ctx: ClassifyContext) -> str:
    action = _RECOVERY_ACTIONS.get(int(m.group("action"), 16), "a recovery action")
    return (f"The NVIDIA driver says the GPU at PCI {m.group('pci').removeprefix('PCI:')} needs {action} "
            f"({m.group('said')}, Xid {XID_RECOVERY}: its recovery action after a fault)")


# ---- CUDA's numbered errors (cudaError_t; CUresult has the same numbers for these) ------------------------------

CUDA_GROUPS = (
    CodeGroup(F.gpu_error, Tier.CAUSE, "a kernel faulted on the device (an illegal address or instruction, a "
              "misaligned address, an assert, a launch that failed or ran past the watchdog): the same faults the "
              "family reads by their names", _codes({
                  700: "an illegal memory access", 702: "the launch timed out and was terminated",
                  710: "a device-side assert triggered", 714: "a hardware stack error",
                  715: "an illegal instruction", 716: "a misaligned address", 717: "an invalid address space",
                  718: "an invalid program counter", 719: "an unspecified launch failure"}), APP_XID_DO,
              "A GPU kernel faulted (CUDA error {code}: {meaning})"),
    CodeGroup(F.gpu_error, Tier.CAUSE, "the GPU's memory failed (an uncorrectable ECC error), as its name says",
              _codes({214: "an uncorrectable ECC error"}), REBOOT_DO, "The GPU reported {meaning} (CUDA error {code})"),
)

# ---- Ascend's runtime (CANN's rt_error_codes.h, ACL_ERROR_RT_*) ---------------------------------------------------

_ACL_SAYS = "The NPU runtime reported {meaning} (ACL_ERROR_RT_{name}, error {code})"
ACL_GROUPS = (
    CodeGroup(F.gpu_error, Tier.CAUSE, "an exception or a trap of a compute unit on the device (the AI core, the "
              "vector core, the AI CPU, FFTS+): a kernel (an operator) faulted on the device, as CUDA's illegal "
              "address or assert does", _codes({
                  507015: "AICORE_EXCEPTION: an AI core exception", 507016: "AICORE_TRAP_EXCEPTION: an AI core trap",
                  507018: "AICPU_EXCEPTION: an AI CPU exception",
                  507035: "VECTOR_CORE_EXCEPTION: a vector core exception",
                  507036: "VECTOR_CORE_TRAP_EXCEPTION: a vector core trap",
                  507042: "AICORE_TRAP_READ_OVERFLOW: an AI core read overflow",
                  507043: "AICORE_TRAP_WRITE_OVERFLOW: an AI core write overflow",
                  507044: "VECTOR_CORE_TRAP_READ_OVERFLOW: a vector core read overflow",
                  507045: "VECTOR_CORE_TRAP_WRITE_OVERFLOW: a vector core write overflow",
                  507049: "FFTS_PLUS_EXCEPTION: an FFTS+ exception",
                  507050: "FFTS_PLUS_TRAP_EXCEPTION: an FFTS+ trap"}), DEVICE_KERNEL_DO, _ACL_SAYS),
    CodeGroup(F.gpu_error, Tier.CAUSE, "the device's task scheduler stopped answering or its DMA failed: the device "
              "or its firmware, as an Xid of the GSP is", _codes({
                  507010: "LOST_HEARTBEAT: the task scheduler lost its heartbeat",
                  507013: "SYS_DMA: a system DMA error"}), NPU_RESET_DO, _ACL_SAYS),
    CodeGroup(F.hang, Tier.GENERIC, "work on the device did not complete within the runtime's timeout (a task on a "
              "compute unit, the host's wait on a stream or an event): what held it (a collective waiting for another "
              "rank, a kernel) the code does not say, so the hang family's, as it reads any wait that ran out; "
              "a fault the log names beside it says more", _codes({
                  107019: "WAIT_TIMEOUT: a wait timed out", 507012: "REPORT_TIMEOUT: a task's report timed out",
                  507014: "AICORE_TIMEOUT: an AI core timeout", 507017: "AICPU_TIMEOUT: an AI CPU timeout",
                  507034: "VECTOR_CORE_TIMEOUT: a vector core timeout",
                  507046: "STREAM_SYNC_TIMEOUT: a stream sync timed out",
                  507047: "EVENT_SYNC_TIMEOUT: an event sync timed out",
                  507048: "FFTS_PLUS_TIMEOUT: an FFTS+ timeout"}), None, _ACL_SAYS),
    CodeGroup(F.oom, Tier.CAUSE, "the runtime could not allocate device memory (rule 2: a resource ran short)",
              _codes({207001: "MEMORY_ALLOCATION: a memory allocation error"}), None, _ACL_SAYS),
)


def _alternatives(words: list[str]) -> str:
    return "|".join(sorted(words, key=len, reverse=True))


# A CUDA number follows `err`/`error`/`error code` with CUDA's (or cuDNN's, cuBLAS's) name before it or just after it
_CUDA_NAMES = r"(?:CUDA|[Cc]uda|CUDNN|cuDNN|cudnn|CUBLAS|cuBLAS|cublas)"


# The names the runtime API (`cudaErrorAssert`) and the driver API (`CUDA_ERROR_ASSERT`) give the numbers above: torch
# names the error so under its message (`Search for `cudaErrorAssert' in https://docs.nvidia.com/...`)
CUDA_ERROR_NAMES = MappingProxyType({
    700: ("IllegalAddress", "ILLEGAL_ADDRESS"), 702: ("LaunchTimeout", "LAUNCH_TIMEOUT"), 710: ("Assert", "ASSERT"),
    714: ("HardwareStackError", "HARDWARE_STACK_ERROR"), 715: ("IllegalInstruction", "ILLEGAL_INSTRUCTION"),
    716: ("MisalignedAddress", "MISALIGNED_ADDRESS"), 717: ("InvalidAddressSpace", "INVALID_ADDRESS_SPACE"),
    718: ("InvalidPc", "INVALID_PC"), 719: ("LaunchFailure", "LAUNCH_FAILED"),
    214: ("ECCUncorrectable", "ECC_UNCORRECTABLE")})
_CUDA_BY_NAME = MappingProxyType({name: code for code, names in CUDA_ERROR_NAMES.items() for name in names})


def cuda_code_pattern(group: CodeGroup) -> str:
    """The line holding one of the group's CUDA numbers, as an error's number (group `code` or `code2`), or its name
    in the runtime's or the driver's API (group `cuda_name`)."""
    nums = _alternatives([str(c) for c in group.codes])
    names = _alternatives([n for c in group.codes for n in CUDA_ERROR_NAMES.get(c, ())])
    return (rf"{_CUDA_NAMES}[^\n]{{0,40}}?\berr(?:or)?(?: code)?\s*[:=#(]?\s*(?P<code>{nums})\b(?![.\d])|"
            rf"\berr(?:or)?(?: code)?\s*[:=#(]?\s*(?P<code2>{nums})\b(?![.\d])(?=[^\n]{{0,60}}?{_CUDA_NAMES})|"
            rf"\b(?:cudaError|CUDA_ERROR_)(?P<cuda_name>{names})\b")


def acl_code_pattern(group: CodeGroup) -> str:
    """The line holding one of the group's Ascend codes: its number after an error's word (`error code:507035`,
    `runtime result = 507011`, `failed: 507035`), or its ACL_ERROR_RT_ name (group `code` or `name`); a call
    just before the number (`AclrtSynchronizeStreamWithTimeout(stream()), error code is …`) is where the quote
    begins (group `said`)."""
    nums = _alternatives([str(c) for c in group.codes])
    names = _alternatives([v.partition(":")[0] for v in group.codes.values()])
    return (rf"(?P<said>[\w:]+\((?:[^()\n]|\([^()\n]*\)){{0,40}}\),?\s*)?"  # the call that failed, quoted with its code
            rf"\b(?:error|code|result|ret|failed|failure)\b[^\n\d]{{0,20}}?(?<!\d)(?P<code>{nums})(?!\d)|"
            rf"\bACL_ERROR_RT_(?P<name>{names})\b")


def code_what(group: CodeGroup) -> What:
    """The "what happened" of a group's code, matched by its number (`code`, `code2`) or its name (`name`)."""
    by_name = {v.partition(": ")[0]: c for c, v in group.codes.items()}

    def what(m: re.Match[str], ctx: ClassifyContext) -> str:
        found = m.groupdict()
        code = int(found.get("code") or found.get("code2") or (
            _CUDA_BY_NAME[found["cuda_name"]] if found.get("cuda_name") else by_name[found["name"]]))
        name, sep, meaning = group.codes[code].partition(": ")
        return group.says.format(code=code, name=name, meaning=meaning if sep else name)
    return what


def code_signs(cls: FailureClass, kinds: set[Kind]) -> tuple[Sign, ...]:
    """The family signs of one class that read the runtimes' codes: one per group, on the kinds of line given."""
    readers = (("CUDA", CUDA_GROUPS, cuda_code_pattern), ("the Ascend runtime", ACL_GROUPS, acl_code_pattern))
    return tuple(sign(f"{runtime}'s numbered error: {g.reason}", message=pattern(g), kinds=kinds, tier=g.tier,
                      what=code_what(g), do=g.do)
                 for runtime, groups, pattern in readers for g in groups if g.cls is cls)
