"""Failure families: what a failure IS, read from an event's structure — the exception's type, where it was raised,
an error code, the kind of line — with a phrase of its message only one sign among several. Pure.

Each :class:`Family` is one row: the class it gives, what happened in words, and its signs. A :class:`Sign` holds when
every part it names holds (the exception's type, its message or the line's text, the subsystem it was raised in, the
kind of line, the tier); a family holds when any of its signs does, and each sign says why it means that family.
The table is read in order, first family first: the startup memory check, a port and a GPU held, whose words are
unmistakable; then the families between the ranks (a peer gone, a rendezvous that never formed, NCCL), whose errors
may mention memory or a timeout as their detail; then memory, before the image and the configuration (an
out-of-memory raised while importing is memory, not the image); then the GPU's faults, the wedges and the engine's
death. After the table, :data:`BY_KIND` decides a line that no family explains by the kind of line it is (an
unrecognised CUDA error is the GPU's, an error of NCCL's is NCCL's).

Adding a family is a row here and a case in ``tests/unit/test_families.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkd.supervisor.events import Event, Kind
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.rulekit import Tier
from sparkd.supervisor.sentences import quote
from sparkd.supervisor.tracebacks import PyException, Subsystem

__all__ = ["BY_KIND", "FAMILIES", "Family", "FamilyHit", "Sign", "judge"]

F, S, K = FailureClass, Subsystem, Kind
_I = re.IGNORECASE


@dataclass(frozen=True)
class Sign:
    reason: str  # why this sign means the family
    types: re.Pattern[str] | None = None  # the exception's type, without its module (fullmatch)
    message: re.Pattern[str] | None = None  # searched in the exception's message, or a line's text
    raised_in: frozenset[Subsystem] | None = None  # the subsystem the exception was raised in
    imported: bool = False  # raised while a module was being imported
    kinds: frozenset[Kind] | None = None  # the kinds of line it applies to (None: any)
    tier: Tier = Tier.CAUSE
    unless: re.Pattern[str] | None = None  # the message or text must not hold this

    def holds(self, event: Event) -> bool:
        exc = event.exception
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if self.types is not None and (exc is None or not self.types.fullmatch(exc.name)):
            return False
        if self.raised_in is not None and (exc is None or exc.subsystem not in self.raised_in):
            return False
        if self.imported and (exc is None or exc.imported is None):
            return False
        subject = exc.message if exc is not None else event.text
        if self.message is not None and self.message.search(subject) is None:
            return False
        return self.unless is None or self.unless.search(subject) is None


def sign(reason: str, types: str | None = None, message: str | None = None, *, raised_in: set[Subsystem] | None = None,
         imported: bool = False, kinds: set[Kind] | None = None, tier: Tier = Tier.CAUSE, flags: int = 0,
         unless: str | None = None) -> Sign:
    return Sign(reason, re.compile(types) if types else None, re.compile(message, flags) if message else None,
                frozenset(raised_in) if raised_in else None, imported, frozenset(kinds) if kinds else None, tier,
                re.compile(unless) if unless else None)


@dataclass(frozen=True)
class Family:
    cls: FailureClass
    what: str  # what happened, before the quoted evidence
    signs: tuple[Sign, ...]


@dataclass(frozen=True)
class FamilyHit:
    cls: FailureClass
    tier: Tier
    what: str  # the "what happened" clause, quoting the evidence
    sign: Sign
    by_kind: bool = False  # decided by `BY_KIND`, only where nothing else speaks


_ERROR_LINES = {K.python, K.vllm, K.cuda, K.other, K.ray}  # lines that may carry an error's text (not NCCL's, torch's)
_DEVICE = r"(?:CUDA|HIP|NPU|XPU|HPU|MPS|GPU|[Dd]evice|ROCm|Ascend|Gaudi)"

FAMILIES: tuple[Family, ...] = (
    Family(F.free_memory_refusal, "vLLM refused to start because too little memory was free", (
        sign("vLLM's startup check compares the free memory with gpu_memory_utilization before it loads anything "
             "(0.11-0.32 wordings, GPU and CPU backends)",
             message=r"(?:Free|Available) memory on (?:device|node)\b.*?\bis less than\b"),
        sign("the same check when weights are held outside the process (0.32)",
             message=r"Externally held weights on device .* exceed the desired GPU memory utilization"),
        sign("memory grew while vLLM profiled: another process (or the page cache) released memory at startup",
             message=r"Error in memory profiling"),
    )),
    Family(F.port_in_use, "A port vLLM needs was already in use", (
        sign("EADDRINUSE, errno 98 (Linux) or 10048 (Windows): bind() found the port taken, whoever reports it "
             "(torch's TCPStore, uvicorn, ZMQ, Gloo)",
             message=r"EADDRINUSE|\[Errno 98\]|errno: 98\b|[Aa]ddress already in use|WSAEADDRINUSE|\b10048\b"),
    )),
    Family(F.gpu_busy, "CUDA reported the GPU busy or unavailable", (
        sign("cudaErrorDevicesUnavailable: the device is in exclusive-process mode and another process holds it",
             message=r"busy or unavailable|cudaErrorDevicesUnavailable", flags=_I),
    )),
    Family(F.peer_lost, "The peer rank went away", (
        sign("NCCL's ncclRemoteError: the remote rank exited or the network between the ranks failed",
             message=r"remote process exited or there was a network error|ncclRemoteError"),
        sign("Ray reports a node of the cluster dead", types=r"NodeDiedError"),
        sign("torch's store or process group found the connection to the other rank reset or closed: fallout of a "
             "local death too, so generic (an HTTP client's reset is no rank's)",
             message=r"Connection reset by peer|Connection closed by (?:remote )?peer|Broken pipe", kinds={K.torch},
             tier=Tier.GENERIC),
        sign("the same raised by torch.distributed", types=r"Dist\w*Error",
             message=r"Connection reset by peer|Connection closed by (?:remote )?peer|Broken pipe", tier=Tier.GENERIC),
        sign("Ray's own words for a node that left the cluster (its raylet's, its GCS's events)",
             message=r"\b(?:node|raylet)\b.{0,240}?(?P<said>\b(?:died|is dead|has been marked dead|was terminated|"
                     r"failed health check)\b.*)", tier=Tier.GENERIC, flags=_I),
        sign("the event Ray's GCS records when it removes a node", message=r"\bRAY_NODE_REMOVED\b",
             tier=Tier.GENERIC),
    )),
    Family(F.rendezvous_timeout, "The ranks never met at the torch.distributed rendezvous", (
        sign("Ray could not place every rank on the cluster (vLLM's timeout, or Ray's autoscaler finding no node that "
             "fits), so they never started to meet",
             message=r"Cannot provide a placement group|No available node types can fulfill resource request"),
        sign("torch's store raises DistStoreError when the ranks do not all arrive in time",
             types=r"DistStoreError", tier=Tier.GENERIC),
        sign("a rank could not reach the store or the Gloo mesh of the others",
             message=r"client socket has timed out after \d+ms while trying to connect|connectFullMesh|"
                     r"Gloo connect\w* failed|Timed out waiting \d+ms for send operation|"
                     r"waiting for clients\. \d+/\d+ clients joined"),
        sign("a connection that fails while the process group is being set up (not NCCL's own error)",
             message=r"[Cc]onnection refused|[Tt]imed out|[Tt]imeout|No route to host|Network is unreachable|"
                     r"Name or service not known", raised_in={S.distributed}, unless=r"\bNCCL\b"),
        sign("NCCL's ranks exchange their id through torch's store first: a store that times out there is the "
             "rendezvous", message=r"ncclUniqueId .{0,80}store.{0,200}(?:[Tt]imeout|timed out)"),
    )),
    Family(F.nccl, "NCCL failed", (
        sign("torch raises DistBackendError for a failure inside the collective backend (NCCL, RCCL)",
             types=r"DistBackendError", tier=Tier.GENERIC),
        sign("NCCL's own error codes", message=r"\bnccl(?:InternalError|SystemError|UnhandledCudaError|"
                                               r"InvalidArgument|InvalidUsage)\b"),
        sign("the collective libraries of other accelerators (HCCL on Ascend, oneCCL on XPU) failing, in their words "
             "or their function names (HcclAllreduce ...)",
             message=r"\b(?:hccl|oneccl|rccl)\w*\b.{0,120}\b(?:error|fail\w*|timeout|timed out|times out)\b|"
                     r"\b(?:error|fail\w*)\b.{0,120}\bhccl\w*", flags=_I),
        sign("Ascend's EI error codes are HCCL's (EI0006: getting a socket to the other ranks timed out)",
             message=r"\bEI\d{4}\b"),
        sign("torch's and vLLM's NCCL wrappers: the detail, when there is one, is an NCCL WARN line",
             message=r"\bNCCL error\b", tier=Tier.GENERIC, flags=_I),
        sign("a Bus error (SIGBUS) in a rank: a shared-memory segment (NCCL's, in /dev/shm) could not be backed, "
             "/dev/shm is too small or full", message=r"Fatal Python error: Bus error"),
        sign("a native crash whose faulting function is NCCL's own (its proxy thread, an nccl* call)",
             message=r"\bPC: @\s+0x[0-9a-f]+\s.*\b(?:nccl\w*|\w*[Pp]roxy\w*)\(\)"),
        sign("ProcessGroupNCCL's own report of a collective that failed or timed out",
             message=r"Some NCCL operations have failed or timed out|NCCL communicator was aborted",
             tier=Tier.GENERIC),
    )),
    Family(F.oom, "vLLM ran out of memory", (
        sign("torch raises OutOfMemoryError from every device's allocator (CUDA, HIP, XPU, NPU); MemoryError is "
             "the host's", types=r"OutOfMemoryError|MemoryError"),
        sign("a device allocator's out-of-memory in any wording (CUDA, HIP, NPU, XPU, HPU, the driver)",
             message=rf"\b{_DEVICE}\b[^.\n]{{0,60}}\bout of memory\b|\bout of (?:device )?memory\b.{{0,40}}"
                     rf"\b{_DEVICE}\b|^out of memory\b", kinds=_ERROR_LINES),
        sign("an allocator that could not have the memory, in other words (torch's host allocator, a device's "
             "'lack of device memory', vLLM's 'not enough GPU memory' while loading); not the KV cache's budget, which "
             "is the config's, nor NCCL's registration",
             message=r"\b(?:lack of|not enough|insufficient|can't allocate|cannot allocate|unable to allocate|failed "
                     r"to allocate)\b.{0,24}\b(?:device |host |GPU |CPU |NPU )?memory\b", kinds=_ERROR_LINES,
             flags=_I, unless=r"KV cache|cache blocks|max_model_len|ibv_|NCCL|/dev/shm"),
        sign("the allocation error codes of CUDA, HIP, cuBLAS, XLA, Ascend's runtime and Intel's Level Zero (whose "
             "out-of-resources is how an XPU reports an allocation it cannot satisfy)",
             message=r"cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUBLAS_STATUS_ALLOC_FAILED|"
                     r"\bRESOURCE_EXHAUSTED\b|ACL_ERROR_RT_MEMORY_ALLOCATION|"
                     r"(?:UR|ZE|PI)_(?:RESULT_)?ERROR_OUT_OF_(?:DEVICE_MEMORY|HOST_MEMORY|RESOURCES)|std::bad_alloc",
             kinds=_ERROR_LINES),
        sign("Gaudi's allocator (PT_DEVMEM) failing an allocation", message=r"PT_DEVMEM\b.{0,40}Allocation failed"),
        sign("Ray's memory monitor killing a worker because its node ran low on memory",
             message=r"(?:killed|died)\b.{0,120}\b(?:low on memory|memory monitor|out of memory)", flags=_I),
        sign("the kernel's and Kubernetes' words for a process killed because memory ran out",
             message=r"Out of memory: Kill(?:ed)? process|oom-kill:|Memory cgroup out of memory|\bOOMKilled\b",
             kinds={K.kernel, K.other}),
    )),
    Family(F.image_error, "vLLM's image cannot run it", (
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
        sign("a module of the image lacks an attribute another one expects: the packages do not match",
             types=r"AttributeError", message=r"^module '[\w.]+' has no attribute"),
        sign("vLLM found no platform it knows in the image (its torch or the platform plugin does not fit the "
             "hardware), whatever frame raised it", message=r"Failed to infer device type|No platform detected"),
        sign("Triton's ptxas in the image could not compile a kernel for this GPU",
             message=r"PTXASError|ptxas fatal|PTXAS error"),
        sign("the image's kernels were not built for this GPU's architecture (CUDA, ROCm, Triton's ptxas)",
             message=r"no kernel image is available|cudaErrorNoKernelImageForDevice|invalid device function|"
                     r"hipErrorNoBinaryForGpu|[Nn]o binary for GPU|PTX was compiled with an unsupported toolchain|"
                     r"sm_\d+a?\b.{0,60}\b(?:not (?:supported|compatible|defined)|unsupported)|"
                     r"\b(?:unsupported|not supported|no supported)\b.{0,40}\b(?:GPU |CUDA |compute )?"
                     r"arch(?:itecture)?s?\b|"
                     r"\bgfx\d+\w*\b.{0,60}\b(?:not supported|unsupported)", flags=_I),
        sign("the image's CUDA needs a newer driver than the host's (vLLM's words, or the NVIDIA container runtime's "
             "check of the image's requirement before it starts)",
             message=r"NVIDIA driver on your system is too old|driver version is insufficient|"
                     r"nvidia-container-cli: requirement error: unsatisfied condition: cuda|"
                     r"forward compatibility was attempted|cudaErrorInsufficientDriver|"
                     r"unsupported display driver / cuda driver combination"),
        sign("a CPU build of torch in an image meant for a GPU",
             message=r"Torch not compiled with (?:CUDA|ROCm|XPU) enabled|not compiled with (?:CUDA|ROCm)"),
    )),
    Family(F.config_error, "vLLM rejected its configuration", (
        sign("an exception raised while vLLM parses its arguments or builds and verifies its config is the "
             "settings' fault", raised_in={S.args, S.config}),
        sign("pydantic validates vLLM's config classes (ModelConfig, VllmConfig, ...): its error is a setting",
             types=r"ValidationError", message=r"validation errors? for \w*Config\b"),
        sign("the model named in the config is not there or not accessible (Hugging Face's own errors)",
             types=r"RepositoryNotFoundError|GatedRepoError|RevisionNotFoundError|HFValidationError|"
                   r"LocalEntryNotFoundError|EntryNotFoundError"),
        sign("the model named in the config is not a model transformers or vLLM can find",
             message=r"is not a local folder and is not a valid model identifier|does not appear to have a file "
                     r"named|Repository Not Found|Cannot access gated repo|Unrecognized model in|"
                     r"architectures? \[?[^\]]*\]? (?:is|are) not supported"),
        sign("what is left for the KV cache after the weights cannot hold a request (negative or too small): "
             "max_model_len or gpu_memory_utilization must change",
             message=r"No available memory for the cache blocks|KV cache is needed, which is larger than the "
                     r"available KV cache memory|Cannot auto-fit max_model_len|[Ii]nsufficient (?:memory for )?KV "
                     r"cache|available KV cache memory[^.]{0,40}-\d|larger than the maximum number of tokens that can "
                     r"be stored in KV cache|To serve at least one request with the model'?s max seq len|"
                     r"available KV cache memory[^.]{0,40}-\d", flags=_I),
        sign("vLLM's (or a build of it's) error line refusing a setting the GPU cannot take",
             message=r"only supported on GPUs with compute capability|must be divisible by", kinds={K.vllm}),
        sign("a setting the GPU or the model cannot take, in vLLM's words for a rejected value",
             types=r"ValueError|NotImplementedError|TypeError|AssertionError",
             message=r"must be divisible by|is not supported|are not supported|not supported (?:for|with|on|by)\b|"
                     r"only supported on GPUs with compute capability|[Uu]nknown (?:quantization|dtype|kv cache dtype)|"
                     r"must be (?:less|greater|at least|at most|between|one of|a positive)\b|"
                     r"max_model_len|tensor[ _]parallel[ _]size|exceeds the (?:model's|maximum)"),
        sign("a device index beyond the GPUs there are: CUDA_VISIBLE_DEVICES or the parallel sizes",
             message=r"invalid device ordinal|cudaErrorInvalidDevice\b|\binvalid device[= ]\d+"),
        sign("the model needs code from its repository that the config did not allow, or a token it was not given",
             message=r"trust_remote_code|\b40[13] Client Error\b"),
    )),
    Family(F.gpu_error, "The GPU reported a fault", (
        sign("CUDA's and HIP's codes for a kernel that faulted on the device",
             message=r"illegal memory access|unspecified launch failure|illegal instruction|misaligned address|"
                     r"the launch timed out and was terminated|"
                     r"cudaErrorIllegalAddress|cudaErrorLaunchFailure|hipErrorIllegalAddress|"
                     r"Memory access fault by GPU|HSA_STATUS_ERROR_\w+|device-side assert triggered|"
                     r"\bGPU [Hh]ang\b"),
        sign("an uncorrectable ECC error: the GPU's memory failed",
             message=r"uncorrectable ECC error|cudaErrorECCUncorrectable"),
        sign("CUDA could not initialise the device: the driver's state (error 802: the fabric manager is not up), "
             "not vLLM", message=r"cudaGetDeviceCount|CUDA driver initialization failed|cuInit|"
                                 r"system not yet initialized|cudaErrorSystemNotReady", raised_in={S.device, S.other}),
    )),
    Family(F.hang, "A rank stopped answering", (
        sign("the executor's wait for a worker's answer (the shared-memory queue, an RPC) ran out",
             types=r"TimeoutError|Empty", raised_in={S.rpc}, tier=Tier.GENERIC),
        sign("Ray's executor waited for a worker's output (a compiled graph's channel, a ray.get) until it timed out",
             types=r"RayChannelTimeoutError|GetTimeoutError", tier=Tier.GENERIC),
    )),
    Family(F.engine_dead, "vLLM's engine died", (
        sign("Ray reports a worker's actor dead without saying why (its node's death is peer_lost, an error inside "
             "it or Ray's memory monitor say more): a worker died",
             types=r"ActorDiedError|RayActorError|ActorUnavailableError", unless=r"creation task|memory",
             tier=Tier.GENERIC),
        sign("vLLM raises EngineDeadError in the API server once its engine core is gone: a consequence",
             types=r"\w*EngineDeadError", tier=Tier.CONSEQUENCE),
    )),
)

# A line no family explains, decided by what kind of line it is and what its writer said.
BY_KIND: tuple[Family, ...] = (
    Family(F.nccl, "NCCL failed", (
        sign("NCCL's WARN is its error line; one that says a call failed is NCCL's failure", kinds={K.nccl},
             message=r"\bWARN\b.*\b(?:[Ff]ailed|[Ff]ailure|[Ee]rror|[Uu]nable|[Cc]annot|[Tt]imeout|timed out)\b"),
        sign("ProcessGroupNCCL's error lines", kinds={K.torch}, message=r"^\S*\[E\d{4} [^\]]*ProcessGroupNCCL",
             tier=Tier.GENERIC),
    )),
    Family(F.gpu_error, "The GPU or its driver reported an error", (
        sign("a CUDA or HIP error no family names: the device or its driver reported it", kinds={K.cuda, K.python},
             message=r"\b(?:CUDA|HIP) (?:driver )?error\b|\b(?:cuda|hip)Error\w+", tier=Tier.GENERIC),
    )),
)


def what_of(family: Family, sign: Sign, event: Event) -> str:
    """The "what happened" clause of a family hit: the family's words, the quoted error and where it was raised."""
    exc: PyException | None = event.exception
    if exc is not None and exc.imported is not None and sign.imported:
        return f"{family.what}: importing {exc.imported} failed with {quote(exc.told)}"
    where = f" (raised in {exc.where})" if exc is not None and exc.where is not None else ""
    return f"{family.what}: {quote(_from_the_sign(sign, event))}{where}"


_QUOTE_FROM = 120  # a sign that holds further into a long line is quoted from where it holds (its `said` group)


def _from_the_sign(sign: Sign, event: Event) -> str:
    said = event.said
    if event.exception is not None or sign.message is None:
        return said
    m = sign.message.search(said)
    if m is None:
        return said
    start = m.start("said") if "said" in m.groupdict() and m.group("said") is not None else m.start()
    return said if start < _QUOTE_FROM else "…" + said[start:]


# How a process is stopped, not why it failed: a Ctrl-C while vLLM builds its config is no config error.
_STOPS = frozenset({"KeyboardInterrupt", "SystemExit", "CancelledError", "GeneratorExit"})


def judge(event: Event) -> FamilyHit | None:
    """The first family of the table one of whose signs holds for the event; else the first of `BY_KIND`. A line vLLM
    logged below ERROR is never evidence (a warning quoting an optional import's ImportError)."""
    if event.below_error or event.kind is Kind.code or (event.exception is not None and event.exception.name in _STOPS):
        return None
    for table in (FAMILIES, BY_KIND):
        for family in table:
            for s in family.signs:
                if s.holds(event):
                    return FamilyHit(family.cls, s.tier, what_of(family, s, event), s, by_kind=table is BY_KIND)
    return None

