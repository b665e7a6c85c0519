"""The failure families of the node itself — memory, the image, the configuration, the GPU's faults: the table's
middle (`families.py` reads them in its order and says how). Pure."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from sparkd.supervisor.devicecodes import code_signs
from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.families_config import CONFIG
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.rulekit import (
    DEEPGEMM,
    DOUBLE_PATCH,
    Tier,
    const,
    fmt,
    what_module,
    what_so,
    with_mem,
)
from sparkd.supervisor.sentences import APP_XID_DO, NO_RETRY_IMAGE, REBOOT_DO
from sparkd.supervisor.subsystems import Subsystem

if TYPE_CHECKING:
    from sparkd.supervisor.context import ClassifyContext

__all__ = ["ERROR_LINES", "NODE", "PROFILED_UNCHANGED"]

F, S, K = FailureClass, Subsystem, Kind
_I = re.IGNORECASE
ERROR_LINES = {K.python, K.vllm, K.cuda, K.other, K.ray}  # lines that may carry an error's text (not NCCL's, torch's)
_ERROR_LINES = ERROR_LINES
_DEVICE = r"(?:CUDA|HIP|NPU|XPU|HPU|MPS|GPU|TPU|MLU|MUSA|[Dd]evice|ROCm|Ascend|Gaudi)"
_DRIVER_INIT_DO = ("check the host's GPU driver (`nvidia-smi` or `rocm-smi`, `journalctl -k`); on an NVSwitch system, "
                   "error 802 means nvidia-fabricmanager is not running — sparkd restarts with backoff")
_NO_DEVICE_DO = (f"give vLLM's container its GPUs (the NVIDIA runtime, --gpus or the device requests), check "
                 f"CUDA_VISIBLE_DEVICES and that the host's driver is loaded (nvidia-smi) — {NO_RETRY_IMAGE}")


def _runtime_not_loaded(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (f"The GPU runtime ({m.group('rt') or m.group('rt2')}) failed to load: the build in the image cannot run on "
            "this host")


# not the device allocator's: the KV cache's budget is the config's, NCCL's registration and /dev/shm are NCCL's, the
# startup check is the refusal's, the driver's NV_ERR_NO_MEMORY is ambiguous (rules.py reads it with MemAvailable)
_NOT_OOM = r"ibv_|NCCL|/dev/shm|[Ff]ree memory on|memory profiling|NV_ERR_NO_MEMORY|register memory|pinned memory"

# vLLM's profiling assertion with free memory the same before and after: the device's reading did not move while
# vLLM allocated (a vGPU, an XPU's reading), not memory another process released (`families.py` leaves it here)
PROFILED_UNCHANGED = r"Initial free memory (?P<free>[\d.]+) GiB, current free memory (?P=free) GiB"

NODE: tuple[Family, ...] = (
    Family(F.oom, "vLLM ran out of memory", (
        sign("vLLM's own words when the weights do not fit", message=r"Failed to load model - not enough GPU memory",
             terms="mem", what=with_mem("vLLM ran out of memory while loading the weights")),
        sign("a device's allocator names the device that ran out (torch's CUDA, HIP, NPU, XPU, MPS wordings)",
             message=r"(?P<dev>CUDA|HIP|NPU|XPU|HPU|MPS|TPU|MLU|MUSA)\b[^.\n]{0,40}\bout of memory\b",
             terms="mem", what=with_mem("{dev} ran out of memory")),
        sign("the kernel's OOM killer names the process it killed", flags=_I, kinds={K.kernel, K.other},
             message=r"out of memory: Killed process \d+ \((?P<comm>[^)]*)\)",
             what=with_mem("The kernel OOM killer killed {comm}")),
        sign("earlyoom names the signal it sent", message=r"earlyoom.*sending (?P<sig>SIG\w+) to process", flags=_I,
             what=with_mem("earlyoom sent {sig} to vLLM because memory ran low")),
        sign("Docker's own record of the container's OOM kill", message=r"OOMKilled[\"']?[:=]?\s*true",
             what=with_mem("Docker reports the container was OOM-killed")),
        sign("torch raises OutOfMemoryError from every device's allocator (CUDA, HIP, XPU, NPU); MemoryError is the "
             "host's, ResourceExhausted XLA's: any exception type that says it ran out of memory",
             types=r"\w*(?:OutOfMemory|OOM|Oom)\w*|MemoryError|\w*ResourceExhausted\w*"),
        sign("a device allocator's out-of-memory in any wording (CUDA, HIP, NPU, XPU, HPU, the driver)", terms="mem",
             message=rf"\b{_DEVICE}\b[^.\n]{{0,60}}\bout of memory\b|\bout of (?:device )?memory\b.{{0,40}}"
                     rf"\b{_DEVICE}\b|(?:^|: )out of memory\b", kinds=_ERROR_LINES, unless=_NOT_OOM),
        sign("memory (device, host, HBM, DRAM) with a shortage (out of, insufficient, lack of, not enough, "
             "exhausted), in any words — not the KV cache's budget, which is the config's, nor NCCL's registration or "
             "/dev/shm", terms="shortmem mem", unless_terms="kv shm", kinds=_ERROR_LINES, unless=_NOT_OOM),
        sign("memory with an allocation that failed (cannot allocate, failed to allocate, that was not possible), in "
             "any words — not the KV cache's, NCCL's or /dev/shm's", terms="alloc mem", unless_terms="kv shm",
             kinds=_ERROR_LINES, unless=_NOT_OOM),
        sign("the allocation error codes and types of every runtime (CUDA, HIP, cuBLAS, XLA, Ascend's ACL and EL0004, "
             "Intel's Level Zero, whose out-of-resources is how an XPU reports an allocation it cannot satisfy)",
             terms="oom", kinds=_ERROR_LINES, unless=_NOT_OOM + r"|\b(?:avoid|prevent|risk of|reduce)\b[^.]{0,30}OOM",
             unless_terms="kv"),
        sign("Gaudi's allocator (PT_DEVMEM) failing an allocation", message=r"PT_DEVMEM\b.{0,40}Allocation failed"),
        *code_signs(F.oom, _ERROR_LINES),
        sign("Ray's memory monitor killing a worker because its node ran low on memory", terms="mem",
             message=r"(?:killed|died)\b.{0,120}\b(?:low on memory|memory monitor|out of memory|memory pressure)",
             flags=_I),
        sign("the kernel's and Kubernetes' words for a process killed because memory ran out",
             message=r"Out of memory: Kill(?:ed)? process|oom-kill:|Memory cgroup out of memory|\bOOMKilled\b",
             kinds={K.kernel, K.other}),
    )),
    Family(F.image_error, "vLLM's image cannot run it", (
        sign("vLLM's mxfp4.py patched twice frees `w13` twice", types=r"UnboundLocalError", do=DOUBLE_PATCH,
             message=r"local variable 'w13' referenced before assignment|cannot access local variable 'w13'",
             what=const("vLLM's mxfp4.py in the image frees `w13` twice (UnboundLocalError)")),
        sign("vLLM needs DeepGEMM for this model and the image lacks it", message=r"DeepGEMM backend is not available",
             what=const("vLLM needs DeepGEMM and the image does not have it (or has an outdated one)"), do=DEEPGEMM),
        sign("the DeepGEMM module itself is missing", message=r"No module named '(?P<mod>deep_gemm)[\w.]*'",
             what=what_module, do=DEEPGEMM),
        sign("a module that cannot be imported is missing from the image; the error names it",
             types=r"ModuleNotFoundError|ImportError", message=r"No module named '(?P<mod>[\w.]+)'", what=what_module),
        sign("a compiled library that cannot resolve a symbol was built against another torch or CUDA",
             types=r"ImportError|OSError", terms="lib",
             message=r"(?:\S*/)?(?P<so>[^/\s:]+\.so[\w.]*): undefined symbol: (?P<sym>\S+)",
             what=fmt("{so} in the image was built against another torch or CUDA (undefined symbol {sym})")),
        sign("a shared library the image lacks (or a driver library a container without GPU access lacks)",
             types=r"ImportError|OSError", terms="lib", what=what_so,
             message=r"(?:\S*/)?(?P<lib>lib[\w.+-]+\.so[\w.]*): cannot open shared object file"),
        sign("vLLM asks importlib.metadata for its packages at startup; one without its dist-info is missing",
             message=r"PackageNotFoundError: No package metadata was found for (?P<pkg>\S+)",
             what=fmt("The image has no package metadata for {pkg} (its dist-info is missing, or it is installed "
                      "under another name): vLLM asks importlib.metadata for it at startup")),
        sign("CUDA's words for kernels not built for this GPU's architecture", terms="hardkernel",
             message=r"no kernel image is available for execution on the device",
             what=const("The image's CUDA kernels were not built for this GPU's architecture (no kernel image is "
                        "available for execution on the device)")),
        sign("Ascend's CANN has no kernel of an operator for this NPU: its kernel registry does not list the SoC "
             "(`The binary_info_config.json of socVersion [ascend310p] does not support opType "
             "[MoeGatingTopKSoftmax]`)",
             message=r"The binary_info_config\.json of socVersion \[(?P<soc>[\w-]+)\] does not support opType "
                     r"\[(?P<op>\w+)\]",
             what=fmt("The image's CANN has no {op} kernel for this NPU ({soc})")),
        sign("vLLM's attention selector found no backend for the model, one refusing for the GPU's compute capability "
             "(`No valid attention backend found … Reasons: {FLASHMLA_SPARSE: [compute capability not supported]}`): "
             "the image has no attention kernel for this model on this GPU — the settings it lists are the model's",
             types=r"ValueError", message=r"No valid attention backend found\b.*\bcompute capability not\s+supported",
             flags=re.S,
             what=const("The image has no attention kernel for this model on this GPU: vLLM found no valid attention "
                        "backend, refused for the GPU's compute capability")),
        sign("the image's CUDA needs a newer driver than the host's; vLLM's and CUDA's words",
             message=r"(?P<msg>The NVIDIA driver on your system is too old|CUDA driver version is insufficient for "
                     r"CUDA runtime version|forward compatibility was attempted on non supported HW|system has "
                     r"unsupported display driver / cuda driver combination|cudaErrorInsufficientDriver)",
             what=fmt("The image's CUDA does not match the host's NVIDIA driver ({msg})"),
             do=f"use an image built for the host's driver, or update the driver — {NO_RETRY_IMAGE}"),
        sign("a module of the image lacks a name another one imports: the packages do not match",
             types=r"ImportError", message=r"cannot import name '(?P<name>\w+)' from '(?P<mod>[\w.]+)'",
             what=fmt("The image's {mod} has no {name}: its packages do not match each other")),
        sign("a module of the image lacks an attribute another one expects: the packages do not match",
             types=r"AttributeError", message=r"^module '(?P<mod>[\w.]+)' has no attribute '(?P<name>\w+)'",
             what=fmt("The image's {mod} has no attribute {name}: its packages do not match each other (a "
                      "FlashInfer, CUTLASS or torch version mismatch)")),
        sign("vLLM's compiled ops could not load a library they need (not a build without them, whose 'No module "
             "named' is normal on some platforms): vLLM says it only as a warning, and what fails after it is its "
             "fallout", any_level=True, needles=("failed to import from vllm._",), tier=Tier.GENERIC,
             message=r"Failed to import from (?P<mod>vllm\._\w+)(?: with|:) \w*Error\(.{0,200}?(?:cannot open shared "
                     r"object file|undefined symbol|version `[^`]+' not found|wrong ELF class)",
             what=fmt("vLLM's compiled ops ({mod}) in the image could not load a library they need")),
        sign("torch's dispatcher has no kernel of an operator for the backend it was called on (`Could not run "
             "'_C_cache_ops::reshape_and_cache' with arguments from the 'CPU' backend`), no such operator at all, or "
             "none for the device: the installed libraries (vLLM's compiled ops, torchvision, an extension) were not "
             "built for this torch or this device, and every call fails the same way",
             message=r"Could not run '(?P<op>[\w:.]+)' with arguments from the '(?P<backend>\w+)' backend|"
                     r"\bNo such operator [\w:.]+|The operator '[\w:.]+' is not currently implemented for the \w+ "
                     r"device"),
        sign("the image's transformers does not know the model's type and says it is out of date (`model type "
             "`gemma3` but Transformers does not recognize this architecture`)",
             message=r"Transformers does not recognize this architecture|your version of Transformers is out of date"),
        sign("vLLM's model registry found the architecture among those it supports but could not inspect it (its "
             "subprocess that imports the model's module failed: `Model architectures [...] failed to be inspected`): "
             "the image's packages do not load, whatever setting is being built; the subprocess's own error, when "
             "logged before it, says more", message=r"\bfailed to be inspected\b|Error in inspecting model "
                                                     r"architecture"),
        sign("vLLM's model registry has no code for the checkpoint's architecture (`Model architectures "
             "['MiniMaxM2ForCausalLM'] are not supported for now`): a model newer than this vLLM, or one it never had; "
             "a newer image serves it, no setting of this one does",
             message=r"\bModel architectures \[[^\]]*\] are not supported\b",
             what=const("This vLLM has no code for the checkpoint's model architecture (a model newer than the image's "
                        "vLLM, or one vLLM does not serve)")),
        sign("vLLM's compiled ops did not import, and the first call of one finds its module's name unbound "
             "(`NameError: name 'vllm_ops' is not defined` in `vllm._custom_ops`, whose import of `vllm._C` failed "
             "quietly): the image's vLLM build", types=r"NameError", message=r"\bname '\w*ops' is not defined",
             what=const("vLLM's compiled ops (vllm._C) did not load, so the first op called is undefined")),
        sign("vLLM's compiled ops (vllm._C) did not load", message=r"'_OpNamespace' '_C' object has no attribute "
                                                                   r"'(?P<name>\w+)'",
             what=fmt("vLLM's compiled ops (vllm._C) did not load, so the op {name} is missing")),
        sign("vLLM's choice of a kernel for a layer found none in this build that runs on this GPU with this "
             "quantization (`Failed to find a kernel that can implement the ScaledMM linear layer. Reasons: …`, "
             "each candidate's reason after it): the image's kernels do not cover the device",
             message=r"Failed to find a kernel that can implement\b"),
        sign("a CPU build of torch in an image meant for a GPU", message=r"Torch not compiled with CUDA enabled",
             what=const("The image's torch is a CPU build (Torch not compiled with CUDA enabled)"),
             do="install the CUDA torch wheel in the image (pip --extra-index-url https://download.pytorch.org/whl/"
                f"cu130) — {NO_RETRY_IMAGE}"),
        sign("an exception raised while a module imports fails the same way every launch: a package in the image "
             "does not load", imported=True),
        sign("a module or name that cannot be imported is missing from the image",
             types=r"ModuleNotFoundError|ImportError"),
        sign("Python's words for a module that is not installed, printed bare (a Ray worker unpickling a task, V0's "
             "engine logging the exception's message as its error line before the traceback)",
             message=r"^No module named '[\w.]+'", kinds={K.other, K.ray, K.vllm}),
        sign("the CPU cannot run an instruction the build uses (SIGILL: a wheel built for AVX-512 or another CPU)",
             message=r"\bIllegal instruction\b\s*\(core dumped\)|Fatal Python error: Illegal instruction"),
        sign("a compiled library that cannot load or resolve a symbol was built for another torch, CUDA or Python",
             message=r"undefined symbol|cannot open shared object file|\.so[\w.]*: cannot|"
                     r"No package metadata was found|operator \S+ does not exist|"
                     r"Couldn't load custom C\+\+ ops|_OpNamespace"),
        sign("a library of the image that will not load, or a symbol or version of one that is not found (a "
             "GLIBC, a .so, an extension), in any words", terms="lib",
             message=r"\b(?:cannot|can't|could not|couldn't|failed to|unable to) (?:open|load|find|import)|"
                     r"\bnot found\b|\bundefined\b|\bmissing\b|\bno such file\b", flags=_I),
        sign("a call whose arguments do not fit the function's signature (an unexpected keyword, too many positional "
             "arguments), raised outside vLLM's arguments and config: packages of the image (vLLM, a platform plugin, "
             "an add-on) written against another version of each other", types=r"TypeError",
             not_raised_in={S.args, S.config},
             message=r"got an unexpected keyword argument|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but "
                     r"\d+ (?:were|was) given|missing \d+ required (?:positional|keyword-only) arguments?|got multiple "
                     r"values for (?:keyword )?argument"),
        sign("vLLM's memory profiling saw the device's free memory unchanged while it allocated its own: the "
             "platform's free-memory reading does not see this process (a virtualised GPU such as HAMi's vGPU, a "
             "platform whose reading vLLM gets wrong, as on Intel XPUs before vLLM's fix)", terms="mem",
             message=rf"Error in memory profiling\. {PROFILED_UNCHANGED}",
             what=fmt("vLLM's memory profiling saw the device's free memory unchanged ({free} GiB) while it "
                      "allocated: the device's memory reading does not see vLLM's own use (a virtualised GPU, or "
                      "this platform's reading in this vLLM)")),
        sign("a collective RPC asked the workers for a method this vLLM's worker does not have (`run_method`'s "
             "NotImplementedError): an add-on written against another vLLM", types=r"NotImplementedError",
             message=r"^Method '[\w.]+' is not implemented\b"),
        sign("a KV connector's transfer library is not in the image (NIXL, Mooncake, LMCache, UCX): vLLM imports it "
             "only for the connector the config names", flags=_I,
             message=r"\b(?:NIXL|Mooncake|LMCache|UCX)\b(?: \w+){0,2} (?:is|are) not (?:available|installed)\b"),
        sign("a file or directory inside a package installed in the image is not there (FlashInfer's `No such file "
             "or directory: '…/dist-packages/flashinfer/data/csrc/…'`): the image's install is incomplete or out of "
             "date — the launch names no such path", types=r"FileNotFoundError|NotADirectoryError",
             message=r"No such file or directory: '[^']*/(?:site|dist)-packages/(?P<pkg>[\w.-]+)/",
             what=fmt("A file of the image's {pkg} package is not there")),
        sign("a compiler the image runs at start-up (an op compiler, Triton, nvcc) cannot find a header, a library or "
             "itself: the image's toolchain is incomplete", terms="missing", flags=_I,
             message=r"\bfatal error: .{1,160}?(?:No such file or directory|file not found)|\bcannot find -l\w+|"
                     r"\b(?:nvcc|gcc|g\+\+|cc1plus|clang\+*|hipcc|ninja|ld)\b[^\n]{0,40}(?:not found|No such file)"),
        sign("a C++ or CUDA extension the image builds at start-up did not build, or found no compiler to build it "
             "with (Triton's C compiler), or the build tool or compiler a kernel's JIT runs as a child failed "
             "(FlashInfer's `ninja`, the `gcc` Triton builds its CUDA helper `cuda_utils.c` with)", flags=_I,
             message=r"Error building extension|ninja: build stopped: subcommand failed|Failed to find C compiler|"
                     r"CalledProcessError: Command '?\[?'(?:\S*/)?(?:ninja|nvcc|hipcc|cmake|make|gcc|g\+\+|cc|c\+\+|"
                     r"clang\+*)'"),
        sign("a CUTLASS kernel of the image failed inside itself on this GPU (`Failed to run cutlass FP4 gemm on "
             "sm120. Error: Error Internal`, `cutlass_gemm_caller, …, Error Internal`): CUTLASS's status for a kernel "
             "launched on an architecture its build does not fit (consumer Blackwell, GB10), which fails the same way "
             "every launch", message=r"(?i:cutlass)[^\n]{0,160}\bError:? Internal\b"),
        sign("a kernel compiler's LLVM aborted the process while it built a kernel (`LLVM ERROR: Failed to compute "
             "parent layout for slice layout.`, Triton's backend on a GPU or dtype it cannot lower): the image's "
             "compiler cannot build this kernel here, and every launch that reaches it fails the same way",
             message=r"^LLVM ERROR: (?!out of memory)"),
        sign("the versions the image's packages were built for and found do not match (the CUDA torch was compiled "
             "with, a wheel's torch ABI)", flags=_I,
             message=r"\bversions? \(?[\w.]*\)? ?(?:mismatch(?:es)?|does not match)\b.{0,80}\b(?:compil\w*|built|"
                     r"installed)|\b(?:compiled|built) (?:with|against|for) .{0,80}\bbut\b.{0,60}\b(?:found|installed|"
                     r"detected|runtime)"),
        sign("vLLM found no platform it knows in the image (its torch or the platform plugin does not fit the "
             "hardware), whatever frame raised it (0.6-0.8 said it as an empty device string), or a worker class "
             "of the image refuses the platform's device type (an add-on's GPU worker on an NPU)", flags=_I,
             message=r"Failed to infer device type|No platform detected|Device string must not be empty|"
                     r"\b(?:Not support(?:ed)?|Unsupported) device type\b"),
        sign("the process sees no accelerator at all, or cannot load the driver's management library (NVML) vLLM "
             "finds the GPU with (torch's, SYCL's and libtpu's words for no device too): the container was started "
             "without the GPUs or the NVIDIA runtime, the visible devices are empty, or the host's driver is not "
             "loaded — the image or the host, and no restart changes it", flags=_I, do=_NO_DEVICE_DO,
             message=r"No (?:CUDA|HIP|ROCm) GPUs are available|no CUDA-capable device is detected|cudaErrorNoDevice\b|"
                     r"CUDA_ERROR_NO_DEVICE|hipErrorNoDevice\b|NVML Shared Library Not Found|"
                     r"NVMLError_LibraryNotFound|NVML_ERROR_LIBRARY_NOT_FOUND|libnvidia-ml\.so[\d.]*: cannot open|"
                     r"couldn't communicate with the NVIDIA driver|nvml error: driver not loaded|"
                     r"could not select device driver \S* with capabilities: \[\[gpu\]\]|"
                     r"Cannot access accelerator device when none is available|No device of requested type available|"
                     r"(?:PI_ERROR|UR_RESULT_ERROR)_DEVICE_NOT_FOUND|TPU initialization failed: No \w+ device found|"
                     r"TPU initialization failed: open\(/dev/\w+\): (?:Operation not permitted|Permission denied)|"
                     r"\b(?:TPU|NPU|XPU|HPU)s? (?:is|are) not available\b"),
        sign("a kernel's launch needs more of a per-block resource (shared memory, registers) than this GPU has "
             "(Triton's OutOfResources with the hardware limit, CUDA's and HIP's too many resources requested for "
             "launch): the kernels' configuration in the image was not made for this GPU, and every launch fails the "
             "same way — not memory running out", flags=_I,
             message=r"\bOutOfResources\b|\bout of resources?: (?:shared memory|registers|smem)\b|"
                     r"too many resources requested for launch|LaunchOutOfResources|LAUNCH_OUT_OF_RESOURCES|"
                     r"Required: \d+, Hardware limit: \d+",
             do=f"use an image whose kernels fit this GPU, or another attention or MoE backend in the config — "
                f"{NO_RETRY_IMAGE}"),
        sign("Triton's ptxas in the image could not compile a kernel for this GPU",
             message=r"PTXASError|ptxas fatal|PTXAS error"),
        sign("the image's kernels were not built for this GPU's architecture, in the runtimes' definite words (no "
             "kernel image, invalid device function, no code object for the gfx target)", terms="hardkernel"),
        sign("an architecture (sm_NN, gfxNNNN, compute capability, a GPU generation) with not supported or "
             "incompatible, in any order and wording — a kernel library without this GPU; a setting or a model "
             "architecture named beside it is the config's", terms="arch unsupported",
             unless_terms="model setting"),
        sign("the image's CUDA needs a newer driver than the host's (vLLM's words, or the NVIDIA container runtime's "
             "check of the image's requirement before it starts)",
             message=r"NVIDIA driver on your system is too old|driver version is insufficient|Found no NVIDIA driver|"
                     r"nvidia-container-cli: requirement error: unsatisfied condition: cuda|"
                     r"forward compatibility was attempted|cudaErrorInsufficientDriver|CUDA_ERROR_INSUFFICIENT_DRIVER|"
                     r"unsupported display driver / cuda driver combination|cudaErrorSystemDriverMismatch|"
                     r"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|cudaErrorCompatNotSupportedOnDevice|"
                     r"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
        sign("a CPU build of torch (or of a kernel library: xFormers' `wasn't build with CUDA support`) in an image "
             "meant for a GPU",
             message=r"Torch not compiled with (?:CUDA|ROCm|XPU) enabled|not compiled with (?:CUDA|ROCm)|"
                     r"\b(?:wasn't|was not|isn't|is not) (?:build|built|compiled) with (?:CUDA|ROCm) support"),
        sign("a GPU runtime (HIP's, CUDA's, ROCm's, HSA's) that fails to load, in its own words (`hip runtime failed "
             "to load.`): the build in the image cannot run here, as with a shared library it cannot open", flags=_I,
             kinds=_ERROR_LINES, what=_runtime_not_loaded,
             message=r"\b(?P<rt>HIP|CUDA|ROCm|HSA) (?:runtime|driver)(?: library)? (?:failed to load|could not be "
                     r"loaded|cannot be loaded|is not loaded)\b|\b(?:failed|unable) to load (?:the )?(?P<rt2>HIP|CUDA|"
                     r"ROCm|HSA) (?:runtime|driver)\b"),
    )),
    CONFIG,
    Family(F.gpu_error, "The GPU reported a fault", (
        sign("the GPU has fallen off the PCIe bus (Xid 79)", message=r"NVRM: GPU (?P<pci>\S+): .*fallen off the bus|"
                                                                     r"has fallen off the bus",
             what=const("The GPU has fallen off the PCIe bus (Xid 79)"), do=REBOOT_DO),
        sign("the PCIe link's uncorrectable fatal error (AER)", message=r"AER: .*Uncorrect\w* \((?P<sev>Fatal)\)",
             what=const("The PCIe link reported an uncorrectable fatal error (AER)"), do=REBOOT_DO),
        sign("the PCIe link's uncorrectable non-fatal error (AER)", tier=Tier.GENERIC,
             message=r"AER: .*Uncorrect\w* \((?P<sev>Non-Fatal)\)",
             what=const("The PCIe link reported an uncorrectable non-fatal error (AER)")),
        sign("CUDA names the fault a kernel caused",
             message=r"CUDA error: (?P<err>an illegal memory access was encountered|unspecified launch failure|"
                     r"an illegal instruction was encountered|misaligned address)",
             what=fmt("A GPU kernel faulted (CUDA error: {err})"), do=APP_XID_DO),
        sign("CUDA names an uncorrectable ECC error", message=r"CUDA error: uncorrectable ECC error encountered",
             what=const("The GPU reported an uncorrectable ECC error"), do=REBOOT_DO),
        sign("CUDA's and HIP's codes for a kernel that faulted on the device",
             message=r"illegal memory access|unspecified launch failure|illegal instruction|misaligned address|"
                     r"the launch timed out and was terminated|"
                     r"cudaErrorIllegalAddress|cudaErrorLaunchFailure|hipErrorIllegalAddress|"
                     r"Memory access fault by GPU|HSA_STATUS_ERROR_\w+|device-side assert triggered|"
                     r"\bGPU [Hh]ang\b"),
        sign("an uncorrectable ECC error: the GPU's memory failed",
             message=r"uncorrectable ECC error|cudaErrorECCUncorrectable"),
        *code_signs(F.gpu_error, _ERROR_LINES),
        sign("a kernel's own assertion as the device prints it, once per thread that failed it: CUDA's `file.cu:N: "
             "kernel: block: [x,y,z], thread: [x,y,z] Assertion `cond` failed.`, SYCL's `global id: [..], local id: "
             "[..]` in its place, HIP's `file:N: function: Device-side assertion `cond' failed.` — the device-side "
             "assert itself, before the runtime's `device-side assert triggered`, which a cut log may lack (never "
             "torch's advice to enable device-side assertions)", kinds=_ERROR_LINES, do=APP_XID_DO,
             message=r"\S:\d+: [^\n]{1,300}?: (?:block: ?\[[\d, ]+\], thread: ?\[[\d, ]+\] |global id: ?\[[\d, ]+\], "
                     r"local id: ?\[[\d, ]+\] |Device-side )[Aa]ssertion [`'][^\n]*[`'] failed"),
        sign("a fault of the device in any runtime's words (an illegal address, a page or MMU fault, an AI core "
             "exception, a lost device), on an error line (an AI core that timed out is no fault: CANN's 507014, "
             "AICORE_TIMEOUT, a wait that ran out, `devicecodes.py`)", terms="fault", kinds=_ERROR_LINES,
             unless=r"(?i)\bai ?core\b[^.\n]{0,40}\btime[sd]? ?out"),
        sign("the same in the kernel's log (amdgpu's page fault, a GPU hang): a fault a kernel may have caused, so "
             "generic (an Xid is rules.py's: its number decides)", terms="fault", kinds={K.kernel}, tier=Tier.GENERIC,
             unless=r"NVRM: Xid"),
        sign("the NVIDIA kernel module and the user-space driver libraries are of different versions (the driver was "
             "upgraded and the node not rebooted): NVML and CUDA fail until the module is reloaded",
             message=r"Driver/library version mismatch|NVML_ERROR_LIB_RM_VERSION_MISMATCH|"
                     r"NVMLError_LibRmVersionMismatch",
             do=REBOOT_DO),
        sign("the driver could not bring the GPUs up: the device count or the driver's initialisation failed, with "
             "the runtime's numbered or named error (torch's `Unexpected error from cudaGetDeviceCount() ... Error "
             "802: system not yet initialized` — the fabric manager not up —, `Error 999: unknown error`; cuInit's "
             "`CUDA_ERROR_SYSTEM_NOT_READY`, XLA's `failed call to cuInit`; HIP's), raised or "
             "logged, even as torch's warning that it sets the devices to none: the driver's state, not vLLM (the "
             "numbers that say the image's CUDA and the driver do not match, or no device at all, are the image "
             "family's, read first)", kinds=_ERROR_LINES, do=_DRIVER_INIT_DO,
             what=const("CUDA could not initialise the GPUs: the driver's state, not vLLM"),
             message=r"Unexpected error from (?:cuda|hip)GetDeviceCount\(\)|"
                     r"\b(?:cuInit|cuDeviceGetCount|cudaGetDeviceCount|hipInit|hipGetDeviceCount)\b(?:\(\d*\))?"
                     r"[^\n]{0,40}?\b(?:failed|returned|results? in|error)\b|\bfailed call to (?:cuInit|hipInit)\b|"
                     r"(?:CUDA|HIP) driver initialization failed|\bCUDA initialization: CUDA unknown error\b|"
                     r"system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY"),
    )),
)

