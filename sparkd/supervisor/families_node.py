"""The failure families of the node itself — memory, the image, the configuration, the GPU's faults: the table's
middle (`families.py` reads them in its order and says how). Pure."""

from __future__ import annotations

import re

from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.rulekit import (
    DEEPGEMM,
    DOUBLE_PATCH,
    Tier,
    const,
    fmt,
    what_missing_path,
    what_module,
    what_oci,
    what_so,
    with_mem,
)
from sparkd.supervisor.sentences import APP_XID_DO, NO_RETRY, NO_RETRY_IMAGE, REBOOT_DO
from sparkd.supervisor.tracebacks import Subsystem

__all__ = ["ERROR_LINES", "NODE"]

F, S, K = FailureClass, Subsystem, Kind
_I = re.IGNORECASE
ERROR_LINES = {K.python, K.vllm, K.cuda, K.other, K.ray}  # lines that may carry an error's text (not NCCL's, torch's)
_ERROR_LINES = ERROR_LINES
_DEVICE = r"(?:CUDA|HIP|NPU|XPU|HPU|MPS|GPU|TPU|MLU|MUSA|[Dd]evice|ROCm|Ascend|Gaudi)"
# the words vLLM (its config, quantization methods and platforms) refuses a value or a combination in: `is not
# supported`, `only per-tensor scales ... are supported`, `AutoAWQMoEMethod only supports 4bit`, `does not support`,
# `Unsupported activation scheme`, `is not implemented for the current platform`
_NOT_SUPPORTED = r"must be divisible by|is not supported|are not supported|not supported (?:for|with|on|by)\b"
_REFUSED = (rf"{_NOT_SUPPORTED}|\b(?:is|are) not yet supported|not (?:yet )?implemented (?:for|with|on|by|in)\b|"
            r"\bonly supports?\b|\b[Oo]nly\b[^.\n]{0,120}?\b(?:is|are) (?:currently |now )?supported\b|"
            r"\b(?:is|are) only supported\b|\b(?:does|do) not (?:yet )?support\b|\b[Uu]nsupported\b")
# a type Python code met and cannot handle (a serializer's `Type '<function Generator>' is not supported`, an operand
# type): no setting
_NOT_A_SETTING = r"<(?:function|class|module|built-in)\b|\b[Tt]ype '|object of type|unsupported operand"
# a count of the devices of any accelerator (vLLM names them by Ray's resource: `required TPUs exceeds the total number
# of available TPUs`), or of a kind's devices (`visible XPU devices`)
_DEVICES = r"(?:\w+ )?(?:[A-Z]PUs|devices|accelerators|chips|cores|neuron_cores)\b"
_KV_DO = f"lower max_model_len or raise gpu_memory_utilization in the config — {NO_RETRY}"
_CONFIG_DO = f"fix the vLLM settings in the config — {NO_RETRY}"
_LAUNCH_DO = f"fix [launch] in the config — {NO_RETRY}"
_NO_DEVICE_DO = (f"give vLLM's container its GPUs (the NVIDIA runtime, --gpus or the device requests), check "
                 f"CUDA_VISIBLE_DEVICES and that the host's driver is loaded (nvidia-smi) — {NO_RETRY_IMAGE}")
# not the device allocator's: the KV cache's budget is the config's, NCCL's registration and /dev/shm are NCCL's, the
# startup check is the refusal's, the driver's NV_ERR_NO_MEMORY is ambiguous (rules.py reads it with MemAvailable)
_NOT_OOM = r"ibv_|NCCL|/dev/shm|[Ff]ree memory on|memory profiling|NV_ERR_NO_MEMORY|register memory|pinned memory"

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
        sign("vLLM's model registry found the architecture among those it supports but could not inspect it (its "
             "subprocess that imports the model's module failed: `Model architectures [...] failed to be inspected`): "
             "the image's packages do not load, whatever setting is being built; the subprocess's own error, when "
             "logged before it, says more", message=r"\bfailed to be inspected\b|Error in inspecting model "
                                                     r"architecture"),
        sign("vLLM's compiled ops (vllm._C) did not load", message=r"'_OpNamespace' '_C' object has no attribute "
                                                                   r"'(?P<name>\w+)'",
             what=fmt("vLLM's compiled ops (vllm._C) did not load, so the op {name} is missing")),
        sign("a CPU build of torch in an image meant for a GPU", message=r"Torch not compiled with CUDA enabled",
             what=const("The image's torch is a CPU build (Torch not compiled with CUDA enabled)"),
             do="install the CUDA torch wheel in the image (pip --extra-index-url https://download.pytorch.org/whl/"
                f"cu130) — {NO_RETRY_IMAGE}"),
        sign("an exception raised while a module imports fails the same way every launch: a package in the image "
             "does not load", imported=True),
        sign("a module or name that cannot be imported is missing from the image",
             types=r"ModuleNotFoundError|ImportError"),
        sign("Python's words for a module that is not installed, printed bare (a Ray worker unpickling a task)",
             message=r"^No module named '[\w.]+'", kinds={K.other, K.ray}),
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
        sign("a compiler the image runs at start-up (an op compiler, Triton, nvcc) cannot find a header, a library or "
             "itself: the image's toolchain is incomplete", terms="missing", flags=_I,
             message=r"\bfatal error: .{1,160}?(?:No such file or directory|file not found)|\bcannot find -l\w+|"
                     r"\b(?:nvcc|gcc|g\+\+|cc1plus|clang\+*|hipcc|ninja|ld)\b[^\n]{0,40}(?:not found|No such file)"),
        sign("a C++ or CUDA extension the image builds at start-up did not build, or found no compiler to build it "
             "with (Triton's C compiler)", flags=_I,
             message=r"Error building extension|ninja: build stopped: subcommand failed|Failed to find C compiler"),
        sign("the versions the image's packages were built for and found do not match (the CUDA torch was compiled "
             "with, a wheel's torch ABI)", flags=_I,
             message=r"\bversions? \(?[\w.]*\)? ?(?:mismatch(?:es)?|does not match)\b.{0,80}\b(?:compil\w*|built|"
                     r"installed)|\b(?:compiled|built) (?:with|against|for) .{0,80}\bbut\b.{0,60}\b(?:found|installed|"
                     r"detected|runtime)"),
        sign("vLLM found no platform it knows in the image (its torch or the platform plugin does not fit the "
             "hardware), whatever frame raised it (0.6-0.8 said it as an empty device string)",
             message=r"Failed to infer device type|No platform detected|Device string must not be empty"),
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
                     r"(?:PI_ERROR|UR_RESULT_ERROR)_DEVICE_NOT_FOUND|TPU initialization failed: No \w+ device found"),
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
                     r"unsupported display driver / cuda driver combination"),
        sign("a CPU build of torch in an image meant for a GPU",
             message=r"Torch not compiled with (?:CUDA|ROCm|XPU) enabled|not compiled with (?:CUDA|ROCm)"),
    )),
    Family(F.config_error, "vLLM rejected its configuration", (
        sign("argparse names the arguments vLLM does not know",
             message=r": error: unrecognized arguments: (?P<args>.+)",
             what=fmt("vLLM does not know the argument(s) {args}"),
             do=f"remove or fix them in the config's vLLM flags — {NO_RETRY}"),
        sign("argparse names the argument it rejected", message=r": error: argument (?P<arg>[^:]+): (?P<msg>.+)",
             what=fmt("vLLM rejected the argument {arg}: {msg}"), do=f"fix the vLLM flags in the config — {NO_RETRY}"),
        sign("argparse names the arguments that are missing",
             message=r": error: the following arguments are required: (?P<args>.+)",
             what=fmt("vLLM is missing required argument(s) {args}"),
             do=f"add them to the config's vLLM flags — {NO_RETRY}"),
        sign("max_model_len above what the model's config allows",
             message=r"User-specified max_model_len \((?P<want>\d+)\) is greater than the derived max_model_len "
                     r"\((?P<derived>[^)]*)\)", what=fmt("max_model_len {want} is larger than the model allows: "
                                                         "{derived}"),
             do="lower max_model_len in the config (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check, at your own "
                f"risk) — {NO_RETRY}"),
        sign("the DSpark patch's own check of the settings",
             message=r"DSpark currently requires uniform (?P<rest>[^.]*)",
             what=fmt("The DSpark patch rejected the configuration: it requires uniform {rest}"),
             do=f"fix the DSpark settings in the config — {NO_RETRY}"),
        sign("the KV cache needed for one request of max_model_len, and what is left, named",
             message=r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than "
                     r"the available KV cache memory \((?P<have>[\d.]+) GiB\)", terms="kv", do=_KV_DO,
             what=fmt("The KV cache cannot hold one request of max_model_len {len}: it needs {need} GiB and only "
                      "{have} GiB is left")),
        sign("what the weights and activations leave for the KV cache, negative or none: the worker logs it at INFO "
             "after profiling, and vLLM cannot serve with it", any_level=True, do=_KV_DO, flags=_I, terms="mem",
             needles=("memory",),
             message=r"(?:available|usable)[ _](?:KV[ _]cache[ _])?memory\b[^.\d-]{0,30}?"
                     r"(?P<left>-[\d.]+(?: ?[GMK]i?B)?|\b0(?:\.0+)?(?: ?[GMK]i?B)?)(?:,|\s*$|\s)",
             what=fmt("The weights and activations leave {left} for the KV cache")),
        sign("the KV cache sized at nothing, as the engine logs it at INFO (V0's `# GPU blocks: 0`, V1's `KV cache "
             "size: 0 tokens` and a concurrency of 0x) — V0's first count only: the `# CPU blocks` after it is the "
             "swap space, which is 0 by design on the CPU backend and with swap_space=0", any_level=True, do=_KV_DO,
             terms="kv", needles=("blocks:", "kv cache size", "maximum concurrency"),
             message=r"(?<![,;]\s)(?<![,;])#\s*\w+ blocks:\s*0\b|\bKV cache size:\s*-?0 tokens|"
                     r"Maximum concurrency for [\d,]+ tokens per request:\s*0(?:\.0+)?x", flags=_I),
        sign("no memory is left for the KV cache after the weights",
             message=r"No available memory for the cache blocks",
             terms="kv", what=const("The weights leave no memory for the KV cache"),
             do=f"raise gpu_memory_utilization or use a smaller model or quantization in the config — {NO_RETRY}"),
        sign("the launch target (a script) is not there", what=what_missing_path, do=_LAUNCH_DO,
             message=r"can't open file '(?P<path>[^']+)': \[Errno 2\] No such file or directory"),
        sign("the container runtime could not execute the launch target", what=what_oci, do=_LAUNCH_DO, flags=_I,
             message=r"OCI runtime \w+ failed: .*?exec: \"(?P<path>[^\"]+)\": (?:stat \S+: )?"
                     r"(?P<why>no such file or directory|executable file not found in \$PATH|permission denied)"),
        sign("vLLM's words for a value the GPU or the model cannot take, on the exception itself",
             types=r"ValueError|NotImplementedError", do=_CONFIG_DO,
             message=rf"(?P<msg>.*?(?:{_NOT_SUPPORTED}).*)", what=fmt("vLLM rejected the configuration: {msg}"),
             unless=_NOT_A_SETTING),
        sign("pydantic's detail line under a config class's validation error names the value",
             message=rf"^\s*Value error, (?P<msg>.*?(?:{_REFUSED})[^[]*)",
             what=fmt("vLLM rejected the configuration: {msg}"),
             do=_CONFIG_DO),
        sign("an exception raised while vLLM parses its arguments or builds and verifies its config is the "
             "settings' fault", raised_in={S.args, S.config}),
        sign("pydantic's error on a config class names the class; its detail (a sign of its own) follows on the next "
             "lines", message=r"\d+ validation errors? for (?P<model>\w+)", tier=Tier.GENERIC,
             what=fmt("vLLM's {model} rejected a setting, named on the log lines that follow")),
        sign("the model named in the config is not there or not accessible (Hugging Face's own errors)",
             types=r"RepositoryNotFoundError|GatedRepoError|RevisionNotFoundError|HFValidationError|"
                   r"LocalEntryNotFoundError|EntryNotFoundError"),
        sign("the model's hub could not be reached to fetch what the config names (offline, a proxy, a firewall): the "
             "model must be given as a local path or the hub made reachable", flags=_I,
             message=r"huggingface\.co\b.{0,200}(?:Max retries exceeded|ConnectionError|timed out|Failed to "
                     r"establish|Temporary failure in name resolution|Network is unreachable)|"
                     r"(?:Max retries exceeded|Failed to establish).{0,200}huggingface\.co"),
        sign("a file or directory the launch names (the model, its config, the tokenizer, a chat template) is not "
             "there, in Python's words: generic, a specific reading of the same line says more",
             types=r"FileNotFoundError", tier=Tier.GENERIC, unless=r"nvcc|gcc|ninja|nvidia-smi|\.so\b|/bin/"),
        sign("a file or directory the process may not read or write (a model mounted without permission, a cache "
             "dir): the launch's files or mounts", types=r"PermissionError", tier=Tier.GENERIC,
             unless=r"/dev/(?:nvidia|dri|kfd|davinci|accel|vfio)"),
        sign("the model named in the config is not a model transformers or vLLM can find",
             message=r"is not a local folder and is not a valid model identifier|does not appear to have a file "
                     r"named|Repository Not Found|Cannot access gated repo|Unrecognized model in|"
                     r"architectures? \[?[^\]]*\]? (?:is|are) not supported|couldn't connect to 'https://huggingface|"
                     r"not the path to a directory containing a file named|Invalid repository ID|No supported config "
                     r"format found|Can't load (?:the configuration|tokenizer) (?:of|for)|Unrecognized configuration "
                     r"class"),
        sign("what is left for the KV cache after the weights cannot hold a request (negative or too small): "
             "max_model_len or gpu_memory_utilization must change",
             message=r"No available memory for the cache blocks|KV cache is needed, which is larger than the "
                     r"available KV cache memory|Cannot auto-fit max_model_len|[Ii]nsufficient (?:memory for )?KV "
                     r"cache|available KV cache memory[^.]{0,40}-\d|larger than the maximum number of tokens that can "
                     r"be stored in KV cache|To serve at least one request with the model'?s max seq len", flags=_I),
        sign("the KV cache with a shortage or a size it cannot reach, in any words (too small, larger than, not "
             "enough, insufficient, no memory for): max_model_len or gpu_memory_utilization must change",
             terms="kv", flags=_I,
             message=r"\b(?:too small|smaller than|larger than|greater than|exceeds?|not enough|insufficient|"
                     r"no (?:available )?memory|cannot (?:hold|fit|allocate)|negative)\b"),
        sign("vLLM's (or a build of it's) error line refusing a setting the GPU cannot take",
             message=r"only supported on GPUs with compute capability|must be divisible by", kinds={K.vllm}),
        sign("a setting (a dtype, a quantization, a backend) the GPU's architecture cannot take, in any words",
             terms="arch unsupported setting"),
        sign("a setting the GPU or the model cannot take, in vLLM's words for a rejected value — not a type Python "
             "code met and cannot handle (a serializer's `Type '<function Generator>' is not supported`), which is "
             "no setting", types=r"ValueError|NotImplementedError|TypeError|AssertionError",
             unless=_NOT_A_SETTING,
             message=rf"{_REFUSED}|only supported on GPUs with compute capability|"
                     r"[Uu]nknown (?:quantization|dtype|kv cache dtype)|"
                     r"must be (?:less|greater|at least|at most|between|one of|a positive)\b|"
                     r"max_model_len|tensor[ _]parallel[ _]size|exceeds the (?:model's|maximum)|(?:exceeds|(?:larger|"
                     rf"greater|more) than) the (?:total )?number of (?:available |visible )?{_DEVICES}|"
                     r"[Cc]annot use .{0,60}\bbackend\b|does not match the \w+(?: \w+)? (?:specified|in the|of the)"),
        sign("a model architecture vLLM does not support", terms="model unsupported"),
        sign("a device index beyond the GPUs there are: CUDA_VISIBLE_DEVICES or the parallel sizes",
             message=r"invalid device ordinal|cudaErrorInvalidDevice\b|\binvalid device[= ]\d+"),
        sign("a device index the node does not have, in other runtimes' words, with the index or the range (an NPU's "
             "'invalid device, set device=1, valid device range is [0, 1)'): the visible devices or the parallel sizes",
             flags=_I, message=r"\bvalid device range\b|device (?:id|index) \S+ (?:is )?out of range|"
                               r"\binvalid device,"),
        sign("torch's own check of a device index against the devices the process sees (`device >= 0 && device < "
             "num_gpus INTERNAL ASSERT FAILED ... device=1, num_gpus=`), or a runtime's word for the index: the "
             "visible devices or the device given (a Ray worker told to use a GPU it does not see)",
             message=r"\bdevice < num_(?:gpus|devices)\b|\bdevice=\d+, num_(?:gpus|devices)=|hipErrorInvalidDevice\b|"
                     r"CUDA_ERROR_INVALID_DEVICE\b"),
        sign("the same without the index ('Invalid device ID.'): generic, the line that names it says more",
             flags=_I, tier=Tier.GENERIC, message=r"\binvalid device ?(?:id|index)\b"),
        sign("the weight loader met a parameter the model's code does not have (a KeyError naming it while the "
             "weights load): the checkpoint does not fit the model as this vLLM builds it — another format or "
             "quantization, or one this version cannot load — and every start fails the same way",
             types=r"KeyError", raised_in={S.loading}, message=r"^'[^']+'",
             what=const("The checkpoint does not fit the model's code as this vLLM builds it: it holds a parameter "
                        "the model does not have"),
             do=f"serve a checkpoint this vLLM can load, or set the quantization it was made with — {NO_RETRY}"),
        sign("the model needs code from its repository that the config did not allow, or a token it was not given",
             message=r"trust_remote_code|\b40[13] Client Error\b"),
    )),
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
        sign("a fault of the device in any runtime's words (an illegal address, a page or MMU fault, an AI core "
             "exception, a lost device), on an error line", terms="fault", kinds=_ERROR_LINES),
        sign("the same in the kernel's log (amdgpu's page fault, a GPU hang): a fault a kernel may have caused, so "
             "generic (an Xid is rules.py's: its number decides)", terms="fault", kinds={K.kernel}, tier=Tier.GENERIC,
             unless=r"NVRM: Xid"),
        sign("the NVIDIA kernel module and the user-space driver libraries are of different versions (the driver was "
             "upgraded and the node not rebooted): NVML and CUDA fail until the module is reloaded",
             message=r"Driver/library version mismatch|NVML_ERROR_LIB_RM_VERSION_MISMATCH|"
                     r"NVMLError_LibRmVersionMismatch",
             do=REBOOT_DO),
        sign("CUDA could not initialise the device: the driver's state (error 802: the fabric manager is not up), "
             "not vLLM", message=r"cudaGetDeviceCount|CUDA driver initialization failed|cuInit|"
                                 r"system not yet initialized|cudaErrorSystemNotReady", raised_in={S.device, S.other}),
    )),
)

