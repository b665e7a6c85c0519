"""The failure vocabulary: which kinds of word an error event holds. Pure.

A family recognises its failure by what the words of one error event say together, not by one phrase: memory that
could not be had (`mem` with `shortmem` or `alloc`), an architecture the build does not support (`arch` with
`unsupported`), a node that died (`peer` with `gone`), a connection refused while the ranks meet (`store` with
`netfail`), a collective library that failed (`ccl` with `failed`). :func:`terms` answers the set of concepts a text
holds; a family's signs name the concepts they need (`familykit.Sign.terms`).

Each concept is a pattern (case-insensitive, error codes and a few capitalised acronyms excepted, ``(?-i:...)``) that
finds a word inside an identifier too where writers glue words together (``NPUOutOfMemoryError``, ``HcclAllreduce``),
and the stems without one of which it cannot match: a text is searched for a concept only when its lower-case form holds
one of them (a substring test, far cheaper than a search), so a line that holds none costs a few dozen substring tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CONCEPTS", "TIMED_OUT", "Concept", "terms"]

# A wait that ran out, as an event: `timed out`, `times out`, a `...Timeout` type or code, `Socket Timeout`, `timeout
# after 30s` — not the word as a setting's name (`timeout_ms=`, `pg timeout default`, `timeout 30.0`, `timeout: 30`,
# `timeout=600000ms`)
TIMED_OUT = (r"(?i:timed[ -]?out\b|times out|deadline exceeded|\bexpired\b|timeouts?(?:Error|Exception|Expired)|"
             r"(?-i:_Timeout)\b|"
             r"(?<![\w=.])timeouts?\b(?!\s*=|\s*:?\s*\d|[_(]|\s+(?:default|is|set|to|value|in|of \d+ ?m?s\b)))")


@dataclass(frozen=True)
class Concept:
    name: str
    stems: tuple[str, ...]  # lower-case substrings, one of which every match holds
    pattern: re.Pattern[str]


def _concept(name: str, stems: str, pattern: str) -> Concept:
    return Concept(name, tuple(stems.split("|")), re.compile(pattern, re.IGNORECASE))


CONCEPTS: tuple[Concept, ...] = (
    # -- memory --
    # the word OOM itself only where it reports one (`OOM when allocating`, `OOMKilled`), not where a message names it
    # as a possibility or a risk (`crashes unexpectedly (OOM, preempted node, etc.)`, `to avoid OOM`)
    _concept("oom", "outofmemory|oom|out_of_|out_of_resources|memoryallocation|memory_allocation|alloc_failed|"
                    "bad_alloc|no_memory|resource_exhausted|resourceexhausted|enomem|memoryerror|out-of-memory|el0004",
             r"OutOfMemory|(?-i:OOM)(?=Kill|_|:|!| (?:when|while|during|error|detected|occurred|happened|killed)\b)|"
             r"oom-kill|oom_kill|oom_reaper|OUT_OF_(?:DEVICE_|HOST_)?MEMORY|ERROR_OUT_OF_RESOURCES|MemoryAllocation|"
             r"MEMORY_ALLOCATION|(?-i:ALLOC_FAILED)|bad_alloc|(?-i:NO_MEMORY)|RESOURCE_EXHAUSTED|ResourceExhausted|"
             r"(?-i:ENOMEM)|(?-i:MemoryError)|\bout-of-memory\b|\bEL0004\b|(?-i:_OOM)\b"),
    _concept("kv", "kv|cache block|blocks|max_model_len|max seq len|max_seq_len|max model len|concurrency",
             r"\bKV[ _-]?cache|\bcache blocks?\b|\bnum_gpu_blocks|\bgpu_blocks\b|#\s*\w+ blocks:|max_model_len|"
             r"max seq len|max_seq_len|\bmax model len|Maximum concurrency for"),
    # in either order: `not enough device memory`, `the NPU memory is insufficient`, `memory exhausted`
    _concept("shortmem", "insufficient|not enough|no |lack|out of|exhausted|too little|full",
             r"\b(?:insufficient|not enough|no (?:free |more |enough |available )?|lack(?:ing|s)? of|(?:ran |run |"
             r"running )?out of|exhausted|too little) ?(?:device |host |GPU |CPU |NPU |HBM |DRAM |video |system )?"
             r"(?:memory|mem\b|HBM|VRAM|DRAM|RAM\b|SMEM|VMEM)|\b(?:memory|HBM|VRAM|DRAM)\b (?:is |was |has been "
             r")?(?:insufficient|not enough|exhausted|full|used up)\b"),
    # memory by its name, or by a size (an allocation that failed names how much it wanted: `2.00 GiB`, `4096 bytes`)
    _concept("mem", "mem|hbm|vram|dram|ram|ib|b|bytes",
             r"\bmemory\b|\bmem\b|\bHBM\d*\b|\bVRAM\b|\bDRAM\b|\bRAM\b|\bSMEM\b|\bVMEM\b|"
             r"\b\d+(?:\.\d+)? ?(?:[KMGTP]i?B|bytes)\b"),
    _concept("alloc", "alloc|reserve|malloc|not possible",
             r"\b(?:cannot|can't|can not|could not|couldn't|unable to|failed to|fail to|not able to|not possible to) "
             r"(?:allocate|alloc|reserve|malloc)\b|\balloc(?:ation)?s? (?:failed|failure|error)|"
             r"\ballocat\w* (?:on device )?failed|\bfailed (?:to allocate|allocation)|That was not possible"),
    # a size reserved for a region by a setting, named as less than the work needs (`but only 50000000B is allocated
    # for trace region`)
    _concept("reserved", "allocated for|reserved for|configured for|set aside for",
             r"\bbut only [\d.,]+ ?(?:[KMGT]i?)?B (?:is|are|was|were|has been|have been) (?:allocated|reserved|"
             r"configured|set aside) for\b"),
    _concept("shm", "/dev/shm|shared|shm", r"/dev/shm|\bshared[ _]memory\b|\bshm\w*"),
    # -- the GPU's architecture and the build's kernels --
    _concept("hardkernel", "no kernel image|kernel image is invalid|invalid_image|invalid device function|"
                           "nokernelimage|nobinaryforgpu|no_binary_for_gpu|"
                           "no binary for|code object|not compiled for|unsupported_ptx|unsupportedptx|"
                           "ptx was compiled|no kernel|no implementation|no compiled",
             r"no kernel image|kernel image is invalid|CUDA_ERROR_INVALID_IMAGE|invalid device function|"
             r"NoKernelImageForDevice|NoBinaryForGpu|NO_BINARY_FOR_GPU|"
             r"no binary for (?:the )?GPU|no (?:compatible |valid )?code objects?|unable to find code object|"
             r"not compiled for (?:this |the )?(?:GPU|device|arch)|UNSUPPORTED_PTX_VERSION|UnsupportedPtxVersion|"
             r"PTX was compiled with an unsupported toolchain|no (?:kernels?|implementation) (?:is )?(?:available|"
             r"found|compiled) for (?:this |the )?(?:GPU|device|arch|sm|gfx)|"
             r"no compiled \w+ for (?:a |this |the )?(?:compute capability|GPU|device|arch|sm)"),
    _concept("arch", "arch|sm|gfx|capabilit|compute_|isa|blackwell|hopper|ampere|turing|volta|pascal|rdna|cdna",
             r"\barch(?:itecture)?s?\b|\bsm_?\d{2,3}[af]?\b|\bgfx\d{3,4}\w*|compute capabilit(?:y|ies)|"
             r"\bcompute_\d{2,3}|CUDA capabilit(?:y|ies)|\bcapability\b|\bSM ?\d{2,3}\b|\bISA\b|\bBlackwell\b|"
             r"\bHopper\b|\bAmpere\b|\bTuring\b|\bVolta\b|\bPascal\b|\bRDNA\d?\b|\bCDNA\d?\b"),
    # a refusal: not supported, incompatible, only X, a size the setting's split does not divide
    _concept("unsupported", "support|compatible|only|require|not built|not compiled|divisible",
             r"not (?:yet )?supported|unsupported|\bno supported\b|(?:does|do|is|are) not support|"
             r"isn't supported|not compatible|incompatible|only supports?\b|only (?:be )?(?:available|supported)|"
             r"requires? (?:a )?(?:GPU|compute|sm|device)|(?:not|wasn't|isn't) (?:built|build|compiled) (?:for|with)|"
             r"(?:is not|isn't|are not|must be) (?:evenly )?divisible by"),
    _concept("model", "for|model", r"ForCausalLM|ForConditionalGeneration|For\w*Classification|"
                                   r"\bmodel[ _](?:type|architecture)s?\b|\bmodel_type\b"),
    _concept("setting", "dtype|bfloat16|bf16|float16|fp16|fp8|fp4|int4|int8|quantiz|awq|gptq|backend|--|"
                        "enforce_eager|speculative|lora",
             r"\bdtype\b|bfloat16|\bbf16\b|float16|\bfp16\b|\bfp8\w*|\bfp4\b|\bnvfp4\b|\bmxfp4\b|\bint[48]\b|"
             r"quantiz\w*|\bawq\b|\bgptq\w*|kv_cache_dtype|\battention backend\b|_BACKEND\b|"
             r"\bAttentionBackendEnum\.\w+|--[a-z][\w-]+|"
             r"\benforce_eager\b|\bspeculative\b|\blora\b"),
    # -- the ranks --
    _concept("ccl", "nccl|rccl|hccl|hccp|hcom|oneccl|xccl|mscclpp|nvshmem|ei",
             r"nccl|rccl|hccl|hccp|\bhcom\w*|oneccl|xccl|mscclpp|nvshmem|\bEI\d{4}\b"),
    _concept("gloo", "gloo|connectfullmesh", r"\bgloo\b|connectFullMesh"),
    _concept("store", "tcpstore|store|rendezvous|c10d|init_process_group|master_|process group|placement group|gcs",
             r"TCPStore|\bstore\b|rendezvous|\bc10d\b|init_process_group|MASTER_ADDR|MASTER_PORT|"
             r"\bprocess group\b|placement group|\bGCS\b"),
    _concept("conn", "socket|connect|handshake|tcp://", r"\bsockets?\b|\bconnect\w*|\bhandshake\b|tcp://"),
    _concept("netfail", "reset by peer|refused|closed|unreachable|no route|not known|broken pipe|eof|hung up|failed to|"
                        "econn|etimedout|ehostunreach",
             r"\breset by peer\b|\brefused\b|\bclosed\b|\bunreachable\b|No route to host|not known|\bbroken pipe\b|"
             r"\bEOF\b|\bhung up\b|failed to (?:connect|recv|send)|"
             r"(?-i:ECONNREFUSED|ECONNRESET|ETIMEDOUT|EHOSTUNREACH)"),
    _concept("timeout", "time|deadline|expired", TIMED_OUT),
    _concept("peer", "node|peer|raylet|remote|head|worker node|other rank|cluster",
             r"\bnodes?\b|\bpeers?\b|\braylet\b|\bremote (?:process|rank|host|end|worker|side|server)|\bhead node\b|"
             r"\bworker node\b|\bother ranks?\b|\bcluster\b"),
    _concept("gone", "dead|died|dies|lost|removed|disconnect|down|health|heartbeat|no longer|terminated|preempted|"
                     "exited|crashed|shut|node_",
             r"\bdead\b|\bdied\b|\bdies\b|\blost\b|\bremoved\b|disconnect\w*|\bis down\b|\bwent down\b|"
             r"failed health ?checks?|missed too many heartbeats|heartbeats? (?:timeout|timed out|missed|lost|"
             r"failed)|no longer (?:alive|reachable)|\bwas terminated\b|\bhas been terminated\b|\bpreempted\b|"
             r"\bexited\b|\bcrashed\b|\bshut ?down\b|NODE_REMOVED|NODE_DEAD"),
    _concept("collective", "collective|reduce|gather|scatter|to_all|toall|to all|barrier|broadcast|send/recv|p2p|"
                           "watchdog",
             r"\bcollective\b|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|\bbarrier\b|\bbroadcast\b|"
             r"send/recv|\bp2p\b|\bwatchdog\b"),
    # -- a port, a device held --
    # ... and a port its writer says another process uses (HCCL's `whether the port is been using by other process`)
    _concept("inuse", "eaddrinuse|in use|errno 98|errno: 98|errno 98|10048|already allocated|in use by|by other|"
                      "by another|by an other|only one usage|bound already|already bound|already been bound",
             r"EADDRINUSE|address (?:already )?in use|\[Errno 98\]|errno:? 98\b|\b10048\b|already in use|"
             r"already allocated|bound already|already (?:been )?bound|in use by another|"
             r"Only one usage of each socket address|"
             r"\bport\b[^\n]{0,80}?\b(?:us(?:ed|ing)|occupied|taken|held) by (?:an ?)?other (?:process|program|"
             r"application|service)"),
    # ... and a process of an earlier run still on it, in the runtime's words (`the last training process is running`)
    _concept("busy", "busy|unavailable|exclusive|acquire|occupied|held by|in use by|process is |process still|"
                     "process running|processes are|processes still|processes running",
             r"busy or unavailable|DevicesUnavailable|DEVICES?_UNAVAILABLE|device (?:is |or resource )?busy|"
             r"\bexclusive[_ ]process\b|acquire failed|already acquired|could not be acquired|\boccupied\b|"
             r"held by another|in use by (?:another |a )?process|"
             r"\b(?:last|previous|earlier|old) (?:\w+ )?process(?:es)? (?:is |are )?(?:still )?running"),
    # -- error codes of the device runtimes (their prefix), and faults --
    _concept("devcode", "cudaerror|cuda_error|cuda error|cuda driver error|cuda failure|cublas_status|cudnn_status|"
                        "hiperror|hip error|hip failure|hsa_status|ze_result|ur_result|pi_error|acl_error|aclerror|"
                        "npu error|npu function error|error code is|drv_error|synstatus|nrt_|nvmlerror_|nvml_error_",
             r"cudaError(?=\w)|CUDA_ERROR_|\bCUDA (?:driver )?(?:error|failure)|\bcuda failure|CUBLAS_STATUS_|"
             r"CUDNN_STATUS_|hipError(?=\w)|\bHIP (?:error|failure)|HSA_STATUS_|ZE_RESULT_|UR_RESULT_|PI_ERROR_|"
             r"ACL_ERROR_|\baclError\b|\bNPU (?:function )?error|\berror code is -?\d+|\bDRV_ERROR|\bsynStatus|"
             r"\bNRT_|NVMLError_\w|NVML_ERROR_\w"),
    _concept("fault", "illegal|launch failure|launchfailure|launch_failed|misaligned|launch timed out|launchtimeout|"
                      "device-side assert|fault|uncorrectable|ecc|fallen off|gpu hang|aicore|hardwarestack|"
                      "device lost|device_lost|gpu_is_lost|gpu is lost|gpuislost|out-of-bounds|out of bounds",
             r"illegal (?:memory access|address|instruction)|IllegalAddress|ILLEGAL_ADDRESS|IllegalInstruction|"
             r"ILLEGAL_INSTRUCTION|unspecified launch failure|LaunchFailure|LAUNCH_FAILED|misaligned address|"
             r"MisalignedAddress|launch timed out|LaunchTimeout|device-side assert(?!ion)|memory access fault|"
             r"\bpage fault\b|\bMMU fault\b|uncorrectable|\bECC\b|ECCUncorrectable|fallen off the bus|\bGPU hang\b|"
             r"\bAICORE\w*|HardwareStackError|\bdevice lost\b|DEVICE_LOST|GPU_IS_LOST|GPU is lost|GpuIsLost|"
             r"\bout[- ]of[- ]bounds memory access\b"),
    # -- the image --
    _concept("lib", ".so|shared object|shared library|symbol|library|dll|glibc|cxxabi|wheel|abi|_c|custom|extension",
             r"\.so\b|shared (?:object|library)|\bsymbol\b|\blibrary\b|\bDLL\b|\bGLIBC\w*|\bCXXABI\w*|\bwheel\b|"
             r"\bABI\b|_C\b|custom (?:C\+\+ )?ops?\b|\bextension\b"),
    _concept("driver", "driver", r"\bdriver\b"),
    _concept("missing", "no module|not found|no such|not exist|missing|unrecognized|unknown|undefined|no attribute|"
                        "cannot import|not installed|not available|could not find|couldn't find|can't find|no package|"
                        "no matching",
             r"\bno module named\b|\bnot found\b|\bno such (?:file|module|device)|\bdoes not exist\b|\bmissing\b|"
             r"\bunrecognized\b|\bunknown\b|\bundefined\b|has no attribute|cannot import|not installed|"
             r"\b(?:is|are) not available\b|"
             r"(?:could not|couldn't|can't|cannot) find|\bno package\b|\bno matching manifest\b"),
    # -- a process that crashed natively (its signal, the crash handler's banner) --
    _concept("crash", "segmentation|sigsegv|sigbus|sigabrt|sigill|signal|core dumped|fatal python|pc: @|bus error|"
                      "illegal instruction|abort",
             r"Segmentation fault|\bSIG(?:SEGV|BUS|ABRT|ILL|FPE)\b|\bsignal \d+\b|core dumped|Fatal Python error|"
             r"\bPC: @|\bBus error\b|Illegal instruction|\babort(?:ed)?\b"),
    # -- an error at all --
    _concept("failed", "error|fail|fatal|abort|invalid|unhandled|exception|crash|panic|cannot|can't|unable",
             r"\berror\w*|\bfail\w*|\bfatal\b|\babort\w*|\binvalid\b|\bunhandled\b|\bexception\b|\bcrash\w*|"
             r"\bpanic\b|\bcannot\b|\bcan't\b|\bunable\b"),
)


_STEMS = tuple((stem, c) for c in CONCEPTS for stem in c.stems)


def terms(text: str) -> frozenset[str]:
    """The concepts `text` holds: those one of whose stems it holds, confirmed by the concept's pattern."""
    low = text.lower()
    candidates = {c for stem, c in _STEMS if stem in low}
    return frozenset(c.name for c in candidates if c.pattern.search(text))
