"""The configuration's failure family: vLLM refusing its arguments, its settings, the model or the checkpoint asked
of it, a KV cache that cannot hold a request, a count of devices beyond those there are, the launch target that is not
there — the table's middle, with the node's (`families_node.py` places it; `families.py` reads them in its order and
says how). Pure."""

from __future__ import annotations

import re

from sparkd.supervisor.events import Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.familykit import Family, sign
from sparkd.supervisor.rulekit import Tier, const, fmt, what_missing_path, what_oci
from sparkd.supervisor.sentences import NO_RETRY
from sparkd.supervisor.settingnames import NAMED_SETTING
from sparkd.supervisor.subsystems import Subsystem

__all__ = ["CONFIG"]

F, S, K = FailureClass, Subsystem, Kind
_I = re.IGNORECASE
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
_PARAMETER_MISFIT = const("The checkpoint does not fit the model's code as this vLLM builds it: it holds a "
                          "parameter the model does not have")
_PARAMETER_DO = f"serve a checkpoint this vLLM can load, or set the quantization it was made with — {NO_RETRY}"
_PERMISSION_DO = (f"give the container or the user the permission the launch needs (a capability, a mount), or drop "
                  f"the setting that asks for it — {NO_RETRY}")

CONFIG = Family(F.config_error, "vLLM rejected its configuration", (
    sign("CUDA refused an operation while vLLM captured its CUDA graphs (a host sync or an allocation in the model's "
         "code, which no graph can hold): a program's error, not the device's, and eager mode runs without capture",
         message=r"operation not permitted when stream is capturing|\bcudaErrorStreamCapture\w+|"
                 r"\bCUDA_ERROR_STREAM_CAPTURE_\w+|operation failed due to a previous error during capture|"
                 r"operation would make the legacy stream depend on a capturing blocking stream",
         what=const("CUDA refused an operation while vLLM captured the model's CUDA graphs (the model's code does "
                    "something a graph cannot hold)"),
         do=f"set enforce_eager = true in the config's vLLM settings, or run a vLLM whose code for this model "
            f"captures — {NO_RETRY}"),
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
         "there, in Python's words: generic, a specific reading of the same line says more — not one inside an "
         "installed package (`…/dist-packages/flashinfer/data/…`: the image's)",
         types=r"FileNotFoundError", tier=Tier.GENERIC,
         unless=r"nvcc|gcc|ninja|nvidia-smi|\.so\b|/bin/|/(?:site|dist)-packages/"),
    sign("a file or directory a setting names (a chat template, a tokenizer, a config file) that vLLM says is not "
         "there, raised as its ValueError outside the engine's step: the setting's fault, as FileNotFoundError's "
         "sign says — not a library, a compiler or a tool the image lacks (the image's)", types=r"ValueError",
         tier=Tier.GENERIC, not_raised_in={S.step}, flags=_I, unless=r"nvcc|gcc|ninja|nvidia-smi|\.so\b|/bin/",
         message=r"(?:\b(?:path|file|directory|folder)\b|\S/\S)[^\n]{0,160}?(?:\bdoes ?n[o']t exist|\bnot exist\b|"
                 r"\bno such file\b|\bnot found\b)"),
    sign("a LoRA adapter the launch names that vLLM finds nothing to load in (`Loading lora [\"x failed: No adapter "
         "found for /path/checkpoint-57\"]`): the `--lora-modules` path or name — when the adapter is loaded, "
         "at the start or at the first request for it", types=r"ValueError|RuntimeError",
         message=r"No adapter found for\b|Loading lora\b.{0,200}\bfailed\b"),
    sign("a file or directory the process may not read or write (a model mounted without permission, a cache "
         "dir): the launch's files or mounts", types=r"PermissionError", tier=Tier.GENERIC,
         unless=r"/dev/(?:nvidia|dri|kfd|davinci|accel|vfio)"),
    sign("the same refusal by the operating system in its error number, carried by another type (a C++ check's "
         "`RuntimeError: mbind failed. errno: 1`, `[Errno 13]`, EPERM, EACCES) outside the engine's "
         "step: the container or the user may not do what the launch asks of it (a capability, a mount, a NUMA "
         "binding), which no restart changes — not a device file (the GPU's access)", tier=Tier.GENERIC,
         types=r"\w*(?:Error|Exception)", not_raised_in={S.step},
         message=r"\berrno[:=]? ?(?:1|13)\b|\[Errno (?:1|13)\]|\bE(?:PERM|ACCES)\b", do=_PERMISSION_DO,
         unless=r"/dev/(?:nvidia|dri|kfd|davinci|accel|vfio)"),
    sign("a file system that refuses a write for want of room (ENOSPC: `[Errno 28] No space left on device`) or over "
         "its quota (EDQUOT: `[Errno 122] Disk quota exceeded`) where the launch keeps its files (the model, a "
         "download, a compile cache, /dev/shm): every start fails the same way until there is room (NCCL's own "
         "segment in /dev/shm is the collectives' sign)",
         message=r"\[Errno (?:28|122)\]|\bE(?:NOSPC|DQUOT)\b|\bNo space left on device\b|\bDisk quota exceeded\b",
         do=f"free space on that file system (or raise its quota; for /dev/shm the container's shm size), or point the "
            f"files at one with room (VLLM_CACHE_ROOT, HF_HOME, TORCHINDUCTOR_CACHE_DIR) — {NO_RETRY}",
         what=const("A file system vLLM writes to is full or over its quota")),
    sign("the model named in the config is not a model transformers or vLLM can find",
         message=r"is not a local folder and is not a valid model identifier|does not appear to have a file "
                 r"named|Repository Not Found|Cannot access gated repo|Unrecognized model in|"
                 r"Cannot find any model weights|"
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
    sign("a region, pool or buffer the launch's settings reserve, said to be smaller than what the work needs, with "
         "the size reserved (tt-metal's `Creating trace buffers of size 55820288B on MeshDevice 0, but only 50000000B "
         "is allocated for trace region`): the same launch fails the same way until the setting grows", flags=_I,
         terms="reserved",
         message=r"\bbut only [\d.,]+ ?(?:[KMGT]i?)?B (?:is|are|was|were|has been|have been) (?:allocated|reserved|"
                 r"configured|set aside) for (?:the )?[\w -]{0,40}?\b(?:region|pool|buffer|arena|space)\b"),
    sign("a number format (bf16, fp8, fp4) said to be unsupported, bare, by whoever checks it (torch inductor's "
         "`BF16 is not supported` on a Turing GPU): the dtype or quantization the launch asks for, which this device "
         "cannot run", flags=_I,
         message=r"(?:^|: )(?:BF16|bfloat16|FP8|float8\w*|FP4|NVFP4|MXFP4) (?:is|are) not supported\b"),
    sign("vLLM's (or a build of it's) error line refusing a setting the GPU cannot take, a size the parallel split "
         "does not divide (`Weight input_size_per_partition = 7392 is not divisible by min_thread_k = 128`, or a "
         "kernel's own check raised as the exception: `RuntimeError: size_n = 2736 is not divisible by tile_n_size = "
         "64`), or an engine version the launch's settings fell to (`CPU backend only supports V1.`)",
         message=r"only supported on GPUs with compute capability|(?:must be|is not|isn't|are not) divisible by|"
                 r"\bonly supports? V[01]\b|\bnot supported (?:on|in|by|with) (?:the )?V[01]\b",
         kinds={K.vllm, K.python}),
    sign("a setting (a dtype, a quantization, a backend) the GPU's architecture cannot take, in any words",
         terms="arch unsupported setting"),
    sign("a setting the GPU or the model cannot take, in vLLM's words for a rejected value — not a type Python "
         "code met and cannot handle (a serializer's `Type '<function Generator>' is not supported`), which is "
         "no setting", types=r"ValueError|NotImplementedError|TypeError|AssertionError",
         unless=_NOT_A_SETTING,
         message=rf"{_REFUSED}|only supported on GPUs with compute capability|"
                 r"[Uu]nknown (?:quantization|dtype|kv cache dtype)|"
                 r"must be (?:less|greater|at least|at most|between|one of|a positive)\b|"
                 r"max_model_len|tensor[ _]parallel[ _]size|exceeds the (?:model's|maximum)|"
                 r"[Cc]annot use .{0,60}\bbackend\b|does not match the \w+(?: \w+)? (?:specified|in the|of the)"),
    sign("a count of devices asked for beyond those there are, in any accelerator's words, whoever says it (vLLM's "
         "`The number of required TPUs exceeds the total number of available TPUs`, `World size (8) is larger than "
         "the number of available GPUs`, `Expected 8 GPUs but found 4`, `only 4 NPUs are available`): the parallel "
         "sizes or the visible devices — raised, not a line logged (vLLM only warns in these words where it then "
         "waits for Ray to place the ranks, the rendezvous's)", do=_CONFIG_DO, types=r"\w*(?:Error|Exception)",
         message=rf"\b(?:exceeds?|(?:larger|greater|more) than)\b (?:the )?(?:total )?number of (?:available |visible "
                 rf"|detected )?{_DEVICES}|\b(?:[Ee]xpected|[Rr]equested|[Rr]equires?|[Nn]eeds?|asked for) "
                 rf"(?:at least )?\d+ {_DEVICES}[^.\n]{{0,40}}\b(?:but|only|while)\b[^.\n]{{0,40}}\b(?:found|got|"
                 rf"available|detected|visible)\b|\bonly \d+ {_DEVICES} (?:are |is )?(?:available|visible|"
                 r"detected|found)"),
    sign("torch's kernels of an operation refuse the dtype on this device (`\"addmm_impl_cpu_\" not implemented "
         "for 'Half'`): the dtype the config asks for on this backend", do=_CONFIG_DO,
         message=r"\"\w+\" not implemented for '\w+'"),
    sign("a ValueError or NotImplementedError that names a setting (a flag, a dtype, a quantization, a backend) "
         "with what it requires or rejects (requires, must, only, invalid, incompatible, no longer), raised outside "
         "the engine's step: vLLM's validation of the settings, wherever it runs (a quantization method, an "
         "attention backend, a connector) — in the step the same type is the engine's", terms="setting",
         types=r"ValueError|NotImplementedError", not_raised_in={S.step}, unless=_NOT_A_SETTING,
         message=r"\brequires?\b|\bmust\b|\bonly\b|\bnot (?:a )?valid\b|\b[Ii]nvalid\b|\bincompatible\b|"
                 r"\bno longer\b|\b[Uu]nknown\b|\bcannot be used\b"),
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
         types=r"KeyError", raised_in={S.loading}, message=r"^'[^']+'", what=_PARAMETER_MISFIT, do=_PARAMETER_DO),
    sign("the same where the frames that would place it in the weights' load are cut off: the key is itself a "
         "model parameter's dotted path (`'language_model.embed_tokens.weight'`), which only a weight loader "
         "looks up", types=r"KeyError", message=r"^'(?:\w+\.)+\w*(?:weight|bias|qweight|qzeros|scales?|g_idx)'",
         what=_PARAMETER_MISFIT, do=_PARAMETER_DO),
    sign("the weight loader met a tensor of another shape than the parameter it loads into (torch's `The size of "
         "tensor a (3072) must match the size of tensor b (6144)`, vLLM's `Attempted to load weight … into "
         "parameter …`, a size mismatch) while the weights load: the checkpoint's layout does not fit the model and "
         "quantization as this vLLM builds them", types=r"RuntimeError|AssertionError|ValueError",
         raised_in={S.loading}, message=r"\bThe size of tensor a \(\d+\) must match the size of tensor b\b|"
                                         r"\bAttempted to load weight\b|\b(?:shape|size) mismatch\b",
         what=const("The checkpoint does not fit the model's code as this vLLM builds it: a tensor's shape is not its "
                    "parameter's"), do=_PARAMETER_DO),
    sign("the weight loader found weights the model's code needs missing from the checkpoint (`Following weights "
         "were not initialized from checkpoint: {'visual.blocks.0.norm1.weight', …}`): a checkpoint of another "
         "architecture or a part of the model (a text-only export of a multimodal model) for this model's code",
         message=r"weights were not initialized from (?:the )?checkpoint",
         what=const("The checkpoint lacks weights the model's code needs (a checkpoint made for another "
                    "architecture, or only part of the model)"),
         do=f"serve a checkpoint that matches the model's architecture, or the architecture the checkpoint was made "
            f"for — {NO_RETRY}"),
    sign("the model needs code from its repository that the config did not allow, or a token it was not given",
         message=r"trust_remote_code|\b40[13] Client Error\b"),
    sign("an error raised outside the engine's step that tells the operator to pass, set or disable one of `vllm "
         "serve`'s flags (`NUMA binding was requested, but vLLM could not detect the GPU-to-NUMA topology "
         "automatically. Pass --numa-bind-nodes explicitly or disable --numa-bind.`): the launch's flags must change",
         types=r"\w*(?:Error|Exception)", not_raised_in={S.step}, flags=_I, do=_CONFIG_DO,
         message=r"\b(?:pass|set|specify|disable|enable|remove|add|use) (?:the (?:flag )?)?--[a-z][a-z0-9-]{2,}\b"),
    sign("a ValueError raised outside the engine's step whose message names one of vLLM's settings by its name (an "
         "EngineArgs field or a `vllm serve` flag, `settingnames.py`: `max_num_batched_tokens (2048)`): vLLM's "
         "checks of the values it was given, wherever they run (the config, the scheduler's encoder budget, a "
         "platform) — in the step the same type is the engine's; last, as the readings above say more",
         types=r"ValueError", not_raised_in={S.step},
         message=NAMED_SETTING, do=_CONFIG_DO),
))
