"""The classifier's rule catalogue: which log line means which failure class, and the sentence it makes.

Every rule is a regular expression over one undecorated log line (colour, process prefixes and tqdm frames
removed by `logline`), a failure class, a tier, and the two halves of the sentence: "what happened" (built
from the match and the `ClassifyContext` facts) and "what to do". The same catalogue reads vLLM's log tail
and the kernel-log lines the daemon passes in (kernel OOM kills, NVRM, Xid, PCIe AER).

Tiers (the lowest wins; within a tier the earliest line):
  0 CAUSE        a specific root cause (free-memory refusal, EADDRINUSE, NCCL error, a missing module, ...)
  1 GENERIC      a cause stated generically (a pydantic ValidationError whose detail is on later lines, an RPC
                 timeout, an Xid that follows from a kernel fault)
  2 CONSEQUENCE  what every failure ends in (`Engine core initialization failed`, `EngineDeadError`)
  3 AMBIGUOUS    a line that also shows up in healthy runs and only explains a death when nothing else does
                 (`NV_ERR_NO_MEMORY` with memory to spare, the TCPStore client's retries, the shm-broadcast wait)

Where a string comes from: vLLM's own format strings (0.11–0.24, see reference/vllm-runtime-surface.md and
reviews/fidelity.md), torch's c10d messages, NCCL's, the kernel's, and the lines the field reports quote
(reference/field-reports, community-recipes.md §12). `tests/data/vllm-logs/` holds a real excerpt for each.

Config and image errors are not restartable, so their patterns are held to a higher bar: a shell "not found"
line only counts with exit 126/127 or when it names the configured launch target, and an image error must be
an import or a symbol that cannot resolve, never an ordinary runtime AttributeError on an object.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.sentences import (
    APP_XID_DO,
    MEMLOCK_DO,
    NO_RETRY,
    NO_RETRY_IMAGE,
    REBOOT_DO,
    STOPPED_FROM_OUTSIDE,
    STOPPED_FROM_OUTSIDE_DO,
    mem_note,
    port_what,
    what_free_memory,
    xid_app_fault,
    xid_fatal,
    xid_what,
)

if TYPE_CHECKING:
    from sparkd.supervisor.context import ClassifyContext

__all__ = ["ANY", "INIT_FAILED", "RULES", "Rule", "Tier", "What"]

INIT_FAILED = "vLLM's engine failed to start"


class Tier(IntEnum):
    CAUSE = 0
    GENERIC = 1
    CONSEQUENCE = 2
    AMBIGUOUS = 3


What = Callable[[re.Match[str], "ClassifyContext"], str]
When = Callable[[re.Match[str], int | None, "ClassifyContext"], bool]


@dataclass(frozen=True)
class Rule:
    cls: FailureClass
    tier: Tier
    pattern: re.Pattern[str]
    what: What | None = None  # the "what happened" clause; None → the class default
    do: str | None = None  # the "what to do" clause; None → the class default
    when: When | None = None  # an extra condition on the match (exit code, context); None → always


def _const(text: str) -> What:
    return lambda m, ctx: text


def _fmt(template: str) -> What:
    """A "what" from the match's named groups: `_fmt("the module {mod} is missing")`."""
    return lambda m, ctx: template.format(**{k: (v or "").strip() for k, v in m.groupdict().items()})


def _exit_127_or_target(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    if exit_code in (126, 127):
        return True
    path = m.groupdict().get("path") or m.groupdict().get("cmd")
    return bool(ctx.launch_target) and path == ctx.launch_target


# "the fatal pattern is the same line with MemAvailable under ~10 GiB" (community-recipes.md §11).
NVRM_LOW_MEMORY_BYTES = 10 * 1024**3


def _memory_was_low(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return ctx.mem_available_bytes is not None and ctx.mem_available_bytes < NVRM_LOW_MEMORY_BYTES


def _what_missing_path(m: re.Match[str], ctx: ClassifyContext) -> str:
    path = m.group("path")
    if ctx.launch_target and path == ctx.launch_target:
        return f"The launch target {path} does not exist"
    return f"{path} does not exist"


def _what_oci(m: re.Match[str], ctx: ClassifyContext) -> str:
    path, why = m.group("path"), m.group("why").lower()
    if why.startswith("permission"):
        return f"Docker could not execute {path} (permission denied)"
    if why.startswith("executable"):
        return f"Docker could not find {path} on the container's PATH"
    return f"{path} does not exist in the container"


def _with_mem(text: str) -> What:
    return lambda m, ctx: text.format(**{k: v or "" for k, v in m.groupdict().items()}) + mem_note(ctx)


def _what_peer(m: re.Match[str], ctx: ClassifyContext) -> str:
    where = f" at {ctx.peer}" if ctx.peer else ""
    why = (m.groupdict().get("why") or "").strip()
    detail = f" ({why})" if why and "closed" not in why else ""
    return f"The peer rank{where} went away: its TCPStore connection closed{detail}"


def _what_nccl(m: re.Match[str], ctx: ClassifyContext) -> str:
    msg = re.sub(r",? NCCL version \S+$", "", m.group("msg").strip()).rstrip(" .,")
    return f"NCCL failed: {msg}"


def _not_a_warning(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    """Image errors never retry, so a line vLLM only logged as a warning (an optional import) does not count."""
    return not _BELOW_ERROR.match(m.string)


_BELOW_ERROR = re.compile(r"(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d")


def _what_nccl_remote(m: re.Match[str], ctx: ClassifyContext) -> str:
    where = f" at {ctx.peer}" if ctx.peer else ""
    return f"NCCL lost the peer rank{where}: the remote process exited or the network failed"


def _what_module(m: re.Match[str], ctx: ClassifyContext) -> str:
    mod = m.group("mod")
    known = {"deep_gemm": " (DeepGEMM)", "flashinfer": " (FlashInfer)", "cutlass": " (CUTLASS DSL)"}
    return f"The image lacks the Python module {mod}{known.get(mod.split('.')[0], '')}"


def _what_so(m: re.Match[str], ctx: ClassifyContext) -> str:
    lib = m.group("lib")
    if lib.startswith(("libcuda.", "libnvidia-")):
        return f"The container cannot load the NVIDIA driver library {lib}: it was started without GPU access"
    return f"The image cannot load the shared library {lib}"


_REBUILD = f"fix or rebuild the image — {NO_RETRY_IMAGE}"
_DEEPGEMM = ("install DeepGEMM into the image (git clone --recursive https://github.com/deepseek-ai/DeepGEMM.git "
             f"&& pip install --no-deps --no-build-isolation .) — {NO_RETRY_IMAGE}")
_FORK = ("if VLLM_WORKER_MULTIPROC_METHOD=fork is set in the config, the container's env or the launch script, "
         "remove it (field report 002); otherwise it is the intermittent cold-boot race of vllm#54259 — sparkd "
         "restarts every rank with backoff")
_SHM_FULL = ("leaked segments fill it or it is too small — sparkd removes dead nccl-* segments before the next start "
             "and restarts every rank with backoff; if it repeats, give vLLM's container a larger /dev/shm "
             "([container] shm_size) or the host's (host_ipc = true)")
_CUSTOM_AR = ("if it repeats, add --disable-custom-all-reduce to the config's vLLM flags (NCCL then does the "
              "all-reduce) — sparkd restarts every rank with backoff")
_DOUBLE_PATCH = ("the mxfp4.py patch (fix-ds4-gpu-cache) was applied twice: `grep -c empty_cache` on mxfp4.py must "
                 "print 2 — dedup it or rebuild the image, and add a [[preflight.assert]] for it — "
                 + NO_RETRY_IMAGE)


def _r(cls: FailureClass, tier: Tier, pattern: str, what: What | None = None, do: str | None = None, *,
       flags: int = 0, when: When | None = None) -> Rule:
    return Rule(cls, tier, re.compile(pattern, flags), what, do, when)


def _image(pattern: str, what: What, do: str = _REBUILD) -> Rule:
    """An image error: never retried, so never from a line vLLM only logged as a warning."""
    return _r(FailureClass.image_error, Tier.CAUSE, pattern, what, do, when=_not_a_warning)


C, G, Q, A = Tier.CAUSE, Tier.GENERIC, Tier.CONSEQUENCE, Tier.AMBIGUOUS
F = FailureClass
_I = re.IGNORECASE
_XID = r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d{1,18})\b"

# Order matters only between rules that can match the same line: the first one listed wins for that line.
RULES: tuple[Rule, ...] = (
    # -- config errors (never retried) --
    # a flag vLLM does not know, or a stray positional (`api_server.py: error: unrecognized arguments: /models/x`)
    _r(F.config_error, C, r": error: unrecognized arguments: (?P<args>.+)",
       _fmt("vLLM does not know the argument(s) {args}"),
       f"remove or fix them in the config's vLLM flags — {NO_RETRY}"),
    _r(F.config_error, C, r": error: argument (?P<arg>[^:]+): (?P<msg>.+)",
       _fmt("vLLM rejected the argument {arg}: {msg}"), f"fix the vLLM flags in the config — {NO_RETRY}"),
    _r(F.config_error, C, r": error: the following arguments are required: (?P<args>.+)",
       _fmt("vLLM is missing required argument(s) {args}"), f"add them to the config's vLLM flags — {NO_RETRY}"),
    _r(F.config_error, C,
       r"User-specified max_model_len \((?P<want>\d+)\) is greater than the derived max_model_len "
       r"\((?P<derived>[^)]*)\)", _fmt("max_model_len {want} is larger than the model allows: {derived}"),
       f"lower max_model_len in the config (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check, at your own "
       f"risk) — {NO_RETRY}"),
    _r(F.config_error, C, r"DSpark currently requires uniform (?P<rest>[^.]*)",
       _fmt("The DSpark patch rejected the configuration: it requires uniform {rest}"),
       f"fix the DSpark settings in the config — {NO_RETRY}"),
    _r(F.config_error, C,
       r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the "
       r"available KV cache memory \((?P<have>[\d.]+) GiB\)",
       _fmt("The KV cache cannot hold one request of max_model_len {len}: it needs {need} GiB and only {have} GiB "
            "is left"), f"lower max_model_len or raise gpu_memory_utilization in the config — {NO_RETRY}"),
    _r(F.config_error, C, r"No available memory for the cache blocks",
       _const("The weights leave no memory for the KV cache"),
       f"raise gpu_memory_utilization or use a smaller model or quantization in the config — {NO_RETRY}"),
    _r(F.config_error, C, r"can't open file '(?P<path>[^']+)': \[Errno 2\] No such file or directory",
       _what_missing_path, f"fix [launch] in the config — {NO_RETRY}"),
    _r(F.config_error, C,
       r"OCI runtime \w+ failed: .*?exec: \"(?P<path>[^\"]+)\": (?:stat \S+: )?"
       r"(?P<why>no such file or directory|executable file not found in \$PATH|permission denied)",
       _what_oci, f"fix [launch] in the config — {NO_RETRY}", flags=_I),
    _r(F.config_error, C,
       r"^(?:\S*/)?(?:ba|da|z)?sh: (?:line \d+: |\d+: )?(?:exec: )?(?P<path>[^:]+): "
       r"(?:No such file or directory|not found|Permission denied)\s*$",
       _what_missing_path, f"fix [launch] in the config — {NO_RETRY}", when=_exit_127_or_target),
    _r(F.config_error, C, r"(?P<cmd>[^\s:]+): command not found", _fmt("The command {cmd} was not found"),
       f"fix [launch] in the config or the image — {NO_RETRY}", when=_exit_127_or_target),
    _r(F.config_error, G, r"\d+ validation errors? for (?P<model>\w+)",
       _fmt("vLLM's {model} rejected a setting, named on the log lines that follow")),
    # -- the image: a module, library or symbol that is not there fails the same way every launch --
    _image(r"UnboundLocalError: (?:local variable 'w13' referenced before assignment|cannot access local variable "
           r"'w13')", _const("vLLM's mxfp4.py in the image frees `w13` twice (UnboundLocalError)"), _DOUBLE_PATCH),
    _image(r"DeepGEMM backend is not available",
           _const("vLLM needs DeepGEMM and the image does not have it (or has an outdated one)"), _DEEPGEMM),
    _image(r"No module named '(?P<mod>deep_gemm)[\w.]*'", _what_module, _DEEPGEMM),
    _image(r"(?:ModuleNotFoundError|ImportError): No module named '(?P<mod>[\w.]+)'", _what_module),
    _image(r"ImportError: (?:\S*/)?(?P<so>[^/\s:]+\.so[\w.]*): undefined symbol: (?P<sym>\S+)",
           _fmt("{so} in the image was built against another torch or CUDA (undefined symbol {sym})")),
    _image(r"ImportError: (?P<lib>lib[\w.+-]+\.so[\w.]*): cannot open shared object file", _what_so),
    _image(r"ImportError: cannot import name '(?P<name>\w+)' from '(?P<mod>[\w.]+)'",
           _fmt("The image's {mod} has no {name}: its packages do not match each other")),
    _image(r"AttributeError: module '(?P<mod>[\w.]+)' has no attribute '(?P<name>\w+)'",
           _fmt("The image's {mod} has no attribute {name}: its packages do not match each other (a FlashInfer, "
                "CUTLASS or torch version mismatch)")),
    _image(r"'_OpNamespace' '_C' object has no attribute '(?P<name>\w+)'",
           _fmt("vLLM's compiled ops (vllm._C) did not load, so the op {name} is missing")),
    _image(r"Torch not compiled with CUDA enabled",
           _const("The image's torch is a CPU build (Torch not compiled with CUDA enabled)"),
           "install the CUDA torch wheel in the image (pip --extra-index-url https://download.pytorch.org/whl/cu130) "
           f"— {NO_RETRY_IMAGE}"),
    # -- startup memory check --
    _r(F.free_memory_refusal, C,
       r"Free memory on device (?:cuda:\d+ )?\(~?(?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\)(?: on startup)? is "
       r"less than desired GPU memory utilization \((?P<util>[\d.]+)(?:, ~?(?P<want>[\d.]+) GiB)?\)",
       what_free_memory),
    _r(F.free_memory_refusal, C,
       r"Error in memory profiling\. Initial free memory (?P<before>[\d.]+) GiB, current free memory "
       r"(?P<after>[\d.]+) GiB",
       _with_mem("vLLM's memory profiling failed: free memory grew from {before} to {after} GiB while it profiled "
                 "(on GB10 the page cache or another process released memory)")),
    # -- out of memory --
    _r(F.oom, C, r"Failed to load model - not enough GPU memory",
       _with_mem("vLLM ran out of memory while loading the weights")),
    _r(F.oom, C, r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory",
       _with_mem("CUDA ran out of memory")),
    _r(F.oom, C, r"out of memory: Killed process \d+ \((?P<comm>[^)]*)\)",
       _with_mem("The kernel OOM killer killed {comm}"), flags=_I),
    _r(F.oom, C, r"earlyoom.*sending (?P<sig>SIG\w+) to process",
       _with_mem("earlyoom sent {sig} to vLLM because memory ran low"), flags=_I),
    _r(F.oom, C, r"OOMKilled[\"']?:?\s*true", _with_mem("Docker reports the container was OOM-killed")),
    # -- ports --
    _r(F.port_in_use, C, r"failed to listen on any local network address\. port: (?P<port>\d+).*EADDRINUSE",
       port_what),
    _r(F.port_in_use, C, r"failed to bind to \S*?:(?P<port>\d+) \(errno: 98", port_what),
    _r(F.port_in_use, C, r"bind on address \('[^']*', (?P<port>\d+)\)\)?: address already in use", port_what,
       flags=_I),
    _r(F.port_in_use, C, r"EADDRINUSE|\[Errno 98\]|Address already in use", port_what, flags=_I),
    # -- GPU held by a stale process --
    # cudaErrorDevicesUnavailable: the CUDA 11+ wording and the older "all CUDA-capable devices are busy"
    _r(F.gpu_busy, C, r"CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy or "
       r"unavailable", flags=_I),
    # -- GPU and PCIe faults (kernel log) --
    _r(F.gpu_error, C, _XID, xid_what, REBOOT_DO, when=xid_fatal),
    _r(F.gpu_error, G, _XID, xid_what, APP_XID_DO, when=xid_app_fault),
    _r(F.gpu_error, C, r"NVRM: GPU (?P<pci>\S+): .*fallen off the bus|has fallen off the bus",
       _const("The GPU has fallen off the PCIe bus (Xid 79)"), REBOOT_DO),
    _r(F.gpu_error, C, r"AER: .*Uncorrect\w* \((?P<sev>Fatal)\)",
       _const("The PCIe link reported an uncorrectable fatal error (AER)"), REBOOT_DO),
    _r(F.gpu_error, G, r"AER: .*Uncorrect\w* \((?P<sev>Non-Fatal)\)",
       _const("The PCIe link reported an uncorrectable non-fatal error (AER)")),
    _r(F.gpu_error, C, r"CUDA error: (?P<err>an illegal memory access was encountered|unspecified launch failure|"
       r"an illegal instruction was encountered|misaligned address)",
       _fmt("A GPU kernel faulted (CUDA error: {err})"), APP_XID_DO),
    _r(F.gpu_error, C, r"CUDA error: uncorrectable ECC error encountered",
       _const("The GPU reported an uncorrectable ECC error"), REBOOT_DO),
    # -- rendezvous --
    _r(F.rendezvous_timeout, C,
       r"Timed out after (?P<secs>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<want>\d+) clients joined",
       _fmt("The head waited {secs} s for the worker to join the rendezvous and only {joined}/{want} ranks arrived")),
    _r(F.rendezvous_timeout, C,
       r"client socket has timed out after (?P<ms>\d{1,18})ms while trying to connect to \((?P<host>[^,]+), "
       r"(?P<port>\d+)\)",
       lambda m, ctx: (f"The worker could not reach the head's rendezvous at {m.group('host')}:{m.group('port')} "
                       f"for {int(m.group('ms')) // 1000} s")),
    _r(F.rendezvous_timeout, C, r"Timed out waiting \d+ms for send operation to complete",
       _const("A gloo send to the other rank timed out during distributed init")),
    _r(F.rendezvous_timeout, G, r"DistStoreError: Socket Timeout",
       _const("A torch.distributed store request to the head timed out (DistStoreError: Socket Timeout)")),
    _r(F.rendezvous_timeout, A, r"TCP client failed to connect/validate to host (?P<addr>\S+?) - retrying",
       _fmt("The worker kept failing to reach the head's rendezvous at {addr}")),
    # -- peer lost (before the NCCL patterns: the "remote process exited" NCCL error is a peer loss) --
    _r(F.peer_lost, C, r"NCCL error(?: in: [^,]*,)?:? remote process exited or there was a network error",
       _what_nccl_remote),
    _r(F.peer_lost, C, r"ncclRemoteError", _what_nccl_remote),
    # a closed TCPStore is a cause on a headless worker whose head went away, and fallout of a local death
    # (a worker process died first) on the node that lost it: generic, so the earlier death wins
    _r(F.peer_lost, G,
       r"(?:recvValue failed|Failed to recv).*?(?P<why>Connection was likely closed|Connection reset by peer|"
       r"Broken pipe)", _what_peer),
    _r(F.peer_lost, G, r"Failed to check the \"should dump\" flag on TCPStore", _what_peer),
    _r(F.peer_lost, G, r"(?P<why>TCPStore server has shut down)", _what_peer),
    _r(F.peer_lost, G, r"ProcessGroupNCCL.*(?P<why>HeartbeatMonitor)", _what_peer),
    # -- NCCL / RDMA --
    _r(F.nccl, C, r"(?P<msg>ibv_reg_mr\w*.*Cannot allocate memory.*)",
       _fmt("NCCL could not register memory with the RDMA NIC ({msg})"), MEMLOCK_DO),
    _r(F.nccl, C, r"(?P<msg>NCCL WARN .*unhandled system error.*)", _what_nccl),
    _r(F.nccl, C, r"(?P<msg>NET/IB .* failed.*)", _what_nccl),
    # the verbs call itself: `NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev ...`
    _r(F.nccl, C, r"NCCL WARN (?P<msg>Call to ibv_\w+ failed[^,]*)", _what_nccl),
    # both of NCCL's shmutils messages for a full /dev/shm: growing a segment, creating one
    _r(F.nccl, C, r"(?:failed to extend|Error while creating shared memory segment) (?P<seg>/dev/shm/nccl-[^\s,]+)"
       r".*No space left on device",
       _fmt("NCCL could not allocate its shared-memory segment {seg}: /dev/shm is full (No space left on device)"),
       _SHM_FULL),
    _r(F.nccl, C, r"(?P<msg>Watchdog caught collective operation timeout)", _what_nccl),
    _r(F.nccl, C, r"(?P<msg>ProcessGroupNCCL's watchdog got stuck for \d+ seconds)", _what_nccl),
    # the wrapper torch and pynccl raise; its detail, when there is one, is an NCCL WARN line above
    _r(F.nccl, G, r"NCCL error(?: in: [^,]*,)?:? (?P<msg>[^(\n]+)", _what_nccl),
    # -- wedges and startup timeouts --
    _r(F.hang, G, r"RPC call to (?P<rpc>\w+) timed out",
       _fmt("A rank stopped answering: the RPC call to {rpc} timed out")),
    _r(F.hang, G, r"Timed out waiting for engines? ?(?:to ?send ?initial ?message|core processes to start)",
       _const("vLLM gave up waiting for its engine to start after VLLM_ENGINE_READY_TIMEOUT_S"),
       "raise VLLM_ENGINE_READY_TIMEOUT_S if loading is just slow — sparkd restarts with backoff"),
    # the executor's wait for a worker's answer timing out inside the shared-memory queue (the TimeoutError behind
    # "RPC call to ... timed out", when the excerpt stops before that line)
    _r(F.hang, G, r"shm_broadcast\.py\", line \d+, in (?:acquire_read|timeout_ms)",
       _const("A rank stopped answering: the engine's wait on the shared-memory queue timed out (TimeoutError)")),
    _r(F.hang, A, r"No available shared memory broadcast block found in \d+ seconds",
       _const("A rank stopped consuming the shared-memory broadcast queue")),
    # -- a silent wedge: vLLM's own throughput line with requests running and no token for a whole interval --
    _r(F.stall, A, r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
       r"Running: (?P<running>[1-9]\d{0,17}) reqs",
       _fmt("vLLM's throughput log shows {running} request(s) running and no token generated")),
    # -- vLLM's own CUDA checks in csrc (CUDACHECK prints this line and exits the worker) --
    _r(F.engine_dead, C, r"Failed: Cuda error (?P<file>\S*custom_all_reduce\S*?):(?P<line>\d+) '(?P<err>[^']+)'",
       _fmt("vLLM's custom all-reduce failed with a CUDA error ('{err}' at {file}:{line})"), _CUSTOM_AR),
    _r(F.engine_dead, C, r"Failed: Cuda error (?P<file>\S+?):(?P<line>\d+) '(?P<err>[^']+)'",
       _fmt("A CUDA call in vLLM's kernels failed ('{err}' at {file}:{line})")),
    # -- the shared-memory ring of the executor (fork, or the GB10 cold-boot race) --
    _r(F.engine_dead, C, r"'ShmRingBuffer' object has no attribute 'shared_memory'",
       _const("vLLM's shared-memory ring could not attach ('ShmRingBuffer' object has no attribute "
              "'shared_memory')"), _FORK),
    # -- the driver's out-of-memory line: a cause when MemAvailable was low, else benign startup noise --
    _r(F.oom, C, r"NV_ERR_NO_MEMORY", _with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY"), when=_memory_was_low),
    _r(F.oom, A, r"NV_ERR_NO_MEMORY", _with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY")),
    # -- consequences: every engine death ends in these --
    _r(F.engine_dead, Q, r"Engine core proc (?P<proc>\S+) died unexpectedly",
       _fmt("vLLM's engine core process {proc} died")),
    _r(F.engine_dead, G, r"Worker proc (?P<proc>\S+) died unexpectedly", _fmt("vLLM's worker process {proc} died")),
    _r(F.engine_dead, Q, r"RayWorkerProc rank=\[\d+\] died unexpectedly", _const("A Ray worker process died")),
    _r(F.engine_dead, Q, r"EngineCore encountered a fatal error", _const("vLLM's engine core hit a fatal error")),
    _r(F.engine_dead, Q,
       r"Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start|"
       r"WorkerProc initialization failed due to an exception in a background process|"
       r"Worker failed with error '",
       _const(INIT_FAILED)),
    _r(F.engine_dead, Q, r"EngineDeadError|AsyncLLM output_handler failed",
       _const("vLLM's engine died (EngineDeadError)")),
    _r(F.engine_dead, Q, r"Parent process exited, terminating worker",
       _const("The worker's parent process (the engine core) went away")),
    # -- a stop from outside: only the API server's SIGTERM/SIGINT handler logs these (0.11-0.22; 0.23+), never the
    # engine core's `trigger received signal=`: vLLM's own shutdown SIGTERMs the engine core, after a crash too --
    _r(F.unknown, Q, r"\[shutdown\] API server: shutdown triggered|[Ss]hutting down FastAPI HTTP server",
       _const(STOPPED_FROM_OUTSIDE), STOPPED_FROM_OUTSIDE_DO),
)
del F


def _unnamed(rule: Rule) -> str:
    body = re.sub(r"\(\?P<\w+>", "(?:", rule.pattern.pattern)
    flag = "i" if rule.pattern.flags & re.IGNORECASE else ""
    return f"(?{flag}:{body})" if flag else f"(?:{body})"


# One search with all patterns combined rejects the ordinary lines before any single rule is tried.
ANY = re.compile("|".join(_unnamed(r) for r in RULES))
