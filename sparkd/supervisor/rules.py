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
from typing import TYPE_CHECKING

from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.peerloss import PEER_LOST_MARKERS
from sparkd.supervisor.rulekit import (
    BELOW_ERROR,
    CUSTOM_AR,
    DEEPGEMM,
    DOUBLE_PATCH,
    ENGINE_SIGNAL_DO,
    FORK,
    INIT_FAILED,
    REBUILD,
    SHM_FULL,
    Rule,
    Tier,
    What,
    const,
    exit_127_or_target,
    fmt,
    image,
    memory_was_low,
    rule,
    what_engine_signal,
    what_missing_path,
    what_module,
    what_nccl,
    what_nccl_remote,
    what_oci,
    what_peer,
    what_peer_link,
    what_so,
    with_mem,
)
from sparkd.supervisor.sentences import (
    APP_XID_DO,
    INTERRUPTED,
    MEMLOCK_DO,
    NO_RETRY,
    NO_RETRY_IMAGE,
    REBOOT_DO,
    STOPPED_FROM_OUTSIDE,
    STOPPED_FROM_OUTSIDE_DO,
    port_what,
    what_free_memory,
    xid_app_fault,
    xid_fatal,
    xid_what,
)

if TYPE_CHECKING:
    pass

__all__ = ["ANY", "INIT_FAILED", "REBUILD", "RULES", "Rule", "Tier", "What"]

C, G, Q, A = Tier.CAUSE, Tier.GENERIC, Tier.CONSEQUENCE, Tier.AMBIGUOUS
F = FailureClass
_I = re.IGNORECASE
CLOSED, STORE_DOWN = PEER_LOST_MARKERS  # one list, read by the instance watch too
_XID = r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d{1,18})\b"

# Order matters only between rules that can match the same line: the first one listed wins for that line.
RULES: tuple[Rule, ...] = (
    # -- config errors (never retried) --
    # a flag vLLM does not know, or a stray positional (`api_server.py: error: unrecognized arguments: /models/x`)
    rule(F.config_error, C, r": error: unrecognized arguments: (?P<args>.+)",
       fmt("vLLM does not know the argument(s) {args}"),
       f"remove or fix them in the config's vLLM flags — {NO_RETRY}"),
    rule(F.config_error, C, r": error: argument (?P<arg>[^:]+): (?P<msg>.+)",
       fmt("vLLM rejected the argument {arg}: {msg}"), f"fix the vLLM flags in the config — {NO_RETRY}"),
    rule(F.config_error, C, r": error: the following arguments are required: (?P<args>.+)",
       fmt("vLLM is missing required argument(s) {args}"), f"add them to the config's vLLM flags — {NO_RETRY}"),
    rule(F.config_error, C,
       r"User-specified max_model_len \((?P<want>\d+)\) is greater than the derived max_model_len "
       r"\((?P<derived>[^)]*)\)", fmt("max_model_len {want} is larger than the model allows: {derived}"),
       f"lower max_model_len in the config (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check, at your own "
       f"risk) — {NO_RETRY}"),
    rule(F.config_error, C, r"DSpark currently requires uniform (?P<rest>[^.]*)",
       fmt("The DSpark patch rejected the configuration: it requires uniform {rest}"),
       f"fix the DSpark settings in the config — {NO_RETRY}"),
    rule(F.config_error, C,
       r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the "
       r"available KV cache memory \((?P<have>[\d.]+) GiB\)",
       fmt("The KV cache cannot hold one request of max_model_len {len}: it needs {need} GiB and only {have} GiB "
            "is left"), f"lower max_model_len or raise gpu_memory_utilization in the config — {NO_RETRY}"),
    # the worker's INFO line after profiling: what the weights and activations left for the KV cache, negative here
    rule(F.config_error, C, r"Available (?:KV cache )?memory: (?P<left>-[\d.]+(?: GiB)?|0(?:\.0+)?(?: GiB)?)(?:,|\s*$)",
       fmt("The weights and activations leave {left} for the KV cache"),
       f"lower max_model_len or raise gpu_memory_utilization in the config — {NO_RETRY}"),
    rule(F.config_error, C, r"No available memory for the cache blocks",
       const("The weights leave no memory for the KV cache"),
       f"raise gpu_memory_utilization or use a smaller model or quantization in the config — {NO_RETRY}"),
    rule(F.config_error, C, r"can't open file '(?P<path>[^']+)': \[Errno 2\] No such file or directory",
       what_missing_path, f"fix [launch] in the config — {NO_RETRY}"),
    rule(F.config_error, C,
       r"OCI runtime \w+ failed: .*?exec: \"(?P<path>[^\"]+)\": (?:stat \S+: )?"
       r"(?P<why>no such file or directory|executable file not found in \$PATH|permission denied)",
       what_oci, f"fix [launch] in the config — {NO_RETRY}", flags=_I),
    rule(F.config_error, C,
       r"^(?:\S*/)?(?:ba|da|z)?sh: (?:line \d+: |\d+: )?(?:exec: )?(?P<path>[^:]+): "
       r"(?:No such file or directory|not found|Permission denied)\s*$",
       what_missing_path, f"fix [launch] in the config — {NO_RETRY}", when=exit_127_or_target),
    rule(F.config_error, C, r"(?<![^\s:])(?P<cmd>[^\s:]+): command not found", fmt("The command {cmd} was not found"),
       f"fix [launch] in the config or the image — {NO_RETRY}", when=exit_127_or_target),
    # the config family's words, on the exception line itself (a traceback's frames are `families.py`'s)
    rule(F.config_error, C, r"(?:^|\] )(?:[\w.]+\.)?(?:ValueError|NotImplementedError): (?P<msg>.*?(?:must be "
       r"divisible by|is not supported|are not supported|not supported (?:for|with|on|by)\b).*)",
       fmt("vLLM rejected the configuration: {msg}"), f"fix the vLLM settings in the config — {NO_RETRY}",
       when=lambda m, exit_code, ctx: not BELOW_ERROR.match(m.string)),
    rule(F.config_error, C, r"^\s*Value error, (?P<msg>.*?(?:must be divisible by|is not supported|are not supported|"
       r"not supported (?:for|with|on|by)\b)[^[]*)", fmt("vLLM rejected the configuration: {msg}"),
       f"fix the vLLM settings in the config — {NO_RETRY}"),
    rule(F.config_error, G, r"\d+ validation errors? for (?P<model>\w+)",
       fmt("vLLM's {model} rejected a setting, named on the log lines that follow")),
    # -- the image: a module, library or symbol that is not there fails the same way every launch --
    image(r"UnboundLocalError: (?:local variable 'w13' referenced before assignment|cannot access local variable "
           r"'w13')", const("vLLM's mxfp4.py in the image frees `w13` twice (UnboundLocalError)"), DOUBLE_PATCH),
    image(r"DeepGEMM backend is not available",
           const("vLLM needs DeepGEMM and the image does not have it (or has an outdated one)"), DEEPGEMM),
    image(r"No module named '(?P<mod>deep_gemm)[\w.]*'", what_module, DEEPGEMM),
    image(r"(?:ModuleNotFoundError|ImportError): No module named '(?P<mod>[\w.]+)'", what_module),
    image(r"(?:ImportError|OSError): (?:\S*/)?(?P<so>[^/\s:]+\.so[\w.]*): undefined symbol: (?P<sym>\S+)",
           fmt("{so} in the image was built against another torch or CUDA (undefined symbol {sym})")),
    image(r"(?:ImportError|OSError): (?:\S*/)?(?P<lib>lib[\w.+-]+\.so[\w.]*): cannot open shared object file",
           what_so),
    image(r"PackageNotFoundError: No package metadata was found for (?P<pkg>\S+)",
           fmt("The image has no package metadata for {pkg} (its dist-info is missing, or it is installed under "
                "another name): vLLM asks importlib.metadata for it at startup")),
    image(r"no kernel image is available for execution on the device",
           const("The image's CUDA kernels were not built for this GPU's architecture (no kernel image is available "
                  "for execution on the device)")),
    image(r"(?P<msg>The NVIDIA driver on your system is too old|CUDA driver version is insufficient for CUDA runtime "
           r"version|forward compatibility was attempted on non supported HW|system has unsupported display driver "
           r"/ cuda driver combination|cudaErrorInsufficientDriver)",
           fmt("The image's CUDA does not match the host's NVIDIA driver ({msg})"),
           f"use an image built for the host's driver, or update the driver — {NO_RETRY_IMAGE}"),
    image(r"ImportError: cannot import name '(?P<name>\w+)' from '(?P<mod>[\w.]+)'",
           fmt("The image's {mod} has no {name}: its packages do not match each other")),
    image(r"AttributeError: module '(?P<mod>[\w.]+)' has no attribute '(?P<name>\w+)'",
           fmt("The image's {mod} has no attribute {name}: its packages do not match each other (a FlashInfer, "
                "CUTLASS or torch version mismatch)")),
    image(r"'_OpNamespace' '_C' object has no attribute '(?P<name>\w+)'",
           fmt("vLLM's compiled ops (vllm._C) did not load, so the op {name} is missing")),
    image(r"Torch not compiled with CUDA enabled",
           const("The image's torch is a CPU build (Torch not compiled with CUDA enabled)"),
           "install the CUDA torch wheel in the image (pip --extra-index-url https://download.pytorch.org/whl/cu130) "
           f"— {NO_RETRY_IMAGE}"),
    # -- startup memory check --
    rule(F.free_memory_refusal, C,
       r"Free memory on device (?:cuda:\d+ )?\(~?(?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\)(?: on startup)? is "
       r"less than desired GPU memory utilization \((?P<util>[\d.]+)(?:, ~?(?P<want>[\d.]+) GiB)?\)",
       what_free_memory),
    rule(F.free_memory_refusal, C,
       r"Error in memory profiling\. Initial free memory (?P<before>[\d.]+) GiB, current free memory "
       r"(?P<after>[\d.]+) GiB",
       with_mem("vLLM's memory profiling failed: free memory grew from {before} to {after} GiB while it profiled "
                 "(on GB10 the page cache or another process released memory)")),
    # -- out of memory --
    rule(F.oom, C, r"Failed to load model - not enough GPU memory",
       with_mem("vLLM ran out of memory while loading the weights")),
    rule(F.oom, C, r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory",
       with_mem("CUDA ran out of memory")),
    rule(F.oom, C, r"out of memory: Killed process \d+ \((?P<comm>[^)]*)\)",
       with_mem("The kernel OOM killer killed {comm}"), flags=_I),
    rule(F.oom, C, r"earlyoom.*sending (?P<sig>SIG\w+) to process",
       with_mem("earlyoom sent {sig} to vLLM because memory ran low"), flags=_I),
    rule(F.oom, C, r"OOMKilled[\"']?[:=]?\s*true", with_mem("Docker reports the container was OOM-killed")),
    # -- ports --
    rule(F.port_in_use, C, r"failed to listen on any local network address\. port: (?P<port>\d+).*EADDRINUSE",
       port_what),
    rule(F.port_in_use, C, r"failed to bind to \S*?:(?P<port>\d+) \(errno: 98", port_what),
    rule(F.port_in_use, C, r"bind on address \('[^']*', (?P<port>\d+)\)\)?: address already in use", port_what,
       flags=_I),
    rule(F.port_in_use, C, r"EADDRINUSE|\[Errno 98\]|Address already in use", port_what, flags=_I),
    # -- GPU held by a stale process --
    # cudaErrorDevicesUnavailable: the CUDA 11+ wording and the older "all CUDA-capable devices are busy"
    rule(F.gpu_busy, C, r"CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy or "
       r"unavailable", flags=_I),
    # -- GPU and PCIe faults (kernel log) --
    rule(F.gpu_error, C, _XID, xid_what, REBOOT_DO, when=xid_fatal),
    rule(F.gpu_error, G, _XID, xid_what, APP_XID_DO, when=xid_app_fault),
    rule(F.gpu_error, C, r"NVRM: GPU (?P<pci>\S+): .*fallen off the bus|has fallen off the bus",
       const("The GPU has fallen off the PCIe bus (Xid 79)"), REBOOT_DO),
    rule(F.gpu_error, C, r"AER: .*Uncorrect\w* \((?P<sev>Fatal)\)",
       const("The PCIe link reported an uncorrectable fatal error (AER)"), REBOOT_DO),
    rule(F.gpu_error, G, r"AER: .*Uncorrect\w* \((?P<sev>Non-Fatal)\)",
       const("The PCIe link reported an uncorrectable non-fatal error (AER)")),
    rule(F.gpu_error, C, r"CUDA error: (?P<err>an illegal memory access was encountered|unspecified launch failure|"
       r"an illegal instruction was encountered|misaligned address)",
       fmt("A GPU kernel faulted (CUDA error: {err})"), APP_XID_DO),
    rule(F.gpu_error, C, r"CUDA error: uncorrectable ECC error encountered",
       const("The GPU reported an uncorrectable ECC error"), REBOOT_DO),
    # -- rendezvous --
    rule(F.rendezvous_timeout, C,
       r"Timed out after (?P<secs>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<want>\d+) clients joined",
       fmt("The head waited {secs} s for the worker to join the rendezvous and only {joined}/{want} ranks arrived")),
    rule(F.rendezvous_timeout, C,
       r"client socket has timed out after (?P<ms>\d{1,18})ms while trying to connect to \((?P<host>[^,]+), "
       r"(?P<port>\d+)\)",
       lambda m, ctx: (f"The worker could not reach the head's rendezvous at {m.group('host')}:{m.group('port')} "
                       f"for {int(m.group('ms')) // 1000} s")),
    rule(F.rendezvous_timeout, C, r"Timed out waiting \d+ms for send operation to complete",
       const("A gloo send to the other rank timed out during distributed init")),
    rule(F.rendezvous_timeout, G, r"DistStoreError: Socket Timeout",
       const("A torch.distributed store request to the head timed out (DistStoreError: Socket Timeout)")),
    rule(F.rendezvous_timeout, A, r"TCP client failed to connect/validate to host (?P<addr>\S+?) - retrying",
       fmt("The worker kept failing to reach the head's rendezvous at {addr}")),
    # -- peer lost (before the NCCL patterns: the "remote process exited" NCCL error is a peer loss) --
    rule(F.peer_lost, C, r"NCCL error(?: in: [^,]*,)?:? remote process exited or there was a network error",
       what_nccl_remote),
    rule(F.peer_lost, C, r"ncclRemoteError", what_nccl_remote),
    # a closed TCPStore is a cause on a headless worker whose head went away, and fallout of a local death
    # (a worker process died first) on the node that lost it: generic, so the earlier death wins
    rule(F.peer_lost, G,
       rf"(?:recvValue failed|Failed to recv).*?(?P<why>{re.escape(CLOSED)}|Connection reset by peer|"
       r"Broken pipe)", what_peer),
    rule(F.peer_lost, G, r"Failed to check the \"should dump\" flag on TCPStore", what_peer),
    rule(F.peer_lost, G, rf"(?P<why>{re.escape(STORE_DOWN)})", what_peer),
    rule(F.peer_lost, G, r"(?P<why>Connection closed by (?:remote )?peer)", what_peer_link),
    rule(F.peer_lost, G, r"ProcessGroupNCCL.*(?P<why>HeartbeatMonitor)", what_peer),
    # -- NCCL / RDMA --
    rule(F.nccl, C, r"(?P<msg>ibv_reg_mr\w*.*Cannot allocate memory.*)",
       fmt("NCCL could not register memory with the RDMA NIC ({msg})"), MEMLOCK_DO),
    rule(F.nccl, C, r"(?P<msg>NCCL WARN .*unhandled system error.*)", what_nccl),
    rule(F.nccl, C, r"(?P<msg>NET/IB .* failed.*)", what_nccl),
    # the verbs call itself: `NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev ...`
    rule(F.nccl, C, r"NCCL WARN (?P<msg>Call to ibv_\w+ failed[^,]*)", what_nccl),
    # both of NCCL's shmutils messages for a full /dev/shm: growing a segment, creating one
    rule(F.nccl, C, r"(?:failed to extend|Error while creating shared memory segment) (?P<seg>/dev/shm/nccl-[^\s,]+)"
       r".*No space left on device",
       fmt("NCCL could not allocate its shared-memory segment {seg}: /dev/shm is full (No space left on device)"),
       SHM_FULL),
    # the NCCL family: every error token, and NCCL's own WARN lines that report a failure
    rule(F.nccl, C, r"\bnccl(?P<msg>InternalError|SystemError|UnhandledCudaError|InvalidArgument|InvalidUsage)\b",
       fmt("NCCL failed with nccl{msg}")),
    rule(F.nccl, C, r"NCCL WARN (?P<msg>.*?\b(?:[Ff]ailed|[Ff]ailure|[Ee]rror|[Uu]nable|[Cc]annot|[Tt]imeout|timed "
       r"out)\b.*)", what_nccl),
    # a collective that timed out is a symptom: an earlier cause (the peer gone) explains it (classify._EXPLAINS)
    rule(F.nccl, G, r"(?P<msg>Watchdog caught collective operation timeout)", what_nccl),
    rule(F.nccl, G, r"(?P<msg>ProcessGroupNCCL's watchdog got stuck for \d+ seconds)", what_nccl),
    # the wrapper torch and pynccl raise; its detail, when there is one, is an NCCL WARN line above
    rule(F.nccl, G, r"NCCL error(?: in: [^,]*,)?:? (?P<msg>[^(\n]+)", what_nccl),
    # -- wedges and startup timeouts --
    # Ray places every rank before vLLM starts them; vLLM's INFO line repeats while it waits (a death after it, and
    # nothing else, is ranks that never met)
    rule(F.rendezvous_timeout, A, r"Waiting for creating a placement group of specs for (?P<secs>\d+) seconds",
       fmt("Ray never placed every rank: vLLM waited {secs} s for its placement group")),
    rule(F.hang, G, r"RPC call to (?P<rpc>\w+) timed out",
       fmt("A rank stopped answering: the RPC call to {rpc} timed out")),
    rule(F.hang, G, r"Timed out waiting for engines? ?(?:to ?send ?initial ?message|core processes to start)",
       const("vLLM gave up waiting for its engine to start after VLLM_ENGINE_READY_TIMEOUT_S"),
       "raise VLLM_ENGINE_READY_TIMEOUT_S if loading is just slow — sparkd restarts with backoff"),
    # the executor's wait for a worker's answer timing out inside the shared-memory queue (the TimeoutError behind
    # "RPC call to ... timed out", when the excerpt stops before that line)
    rule(F.hang, G, r"shm_broadcast\.py\", line \d+, in (?:acquire_read|timeout_ms)",
       const("A rank stopped answering: the engine's wait on the shared-memory queue timed out (TimeoutError)")),
    rule(F.hang, A, r"No available shared memory broadcast block found in \d+ seconds",
       const("A rank stopped consuming the shared-memory broadcast queue")),
    # -- a silent wedge: vLLM's own throughput line with requests running and no token for a whole interval --
    rule(F.stall, A, r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
       r"Running: (?P<running>[1-9]\d{0,17}) reqs",
       fmt("vLLM's throughput log shows {running} request(s) running and no token generated")),
    # the same with the requests queued and none scheduled (V0's `Pending`, V1's `Waiting`)
    rule(F.stall, A, r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
       r"Running: 0 reqs,.*?(?:Pending|Waiting): (?P<waiting>[1-9]\d{0,17}) reqs",
       fmt("vLLM's throughput log shows {waiting} request(s) waiting, none scheduled and no token generated")),
    # -- vLLM's own CUDA checks in csrc (CUDACHECK prints this line and exits the worker) --
    rule(F.engine_dead, C, r"Failed: Cuda error (?P<file>\S*custom_all_reduce\S*?):(?P<line>\d+) '(?P<err>[^']+)'",
       fmt("vLLM's custom all-reduce failed with a CUDA error ('{err}' at {file}:{line})"), CUSTOM_AR),
    rule(F.engine_dead, C, r"Failed: Cuda error (?P<file>\S+?):(?P<line>\d+) '(?P<err>[^']+)'",
       fmt("A CUDA call in vLLM's kernels failed ('{err}' at {file}:{line})")),
    # -- the shared-memory ring of the executor (fork, or the GB10 cold-boot race) --
    rule(F.engine_dead, C, r"'ShmRingBuffer' object has no attribute 'shared_memory'",
       const("vLLM's shared-memory ring could not attach ('ShmRingBuffer' object has no attribute "
              "'shared_memory')"), FORK),
    # -- the driver's out-of-memory line: a cause when MemAvailable was low, else benign startup noise --
    rule(F.oom, C, r"NV_ERR_NO_MEMORY", with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY"), when=memory_was_low),
    rule(F.oom, A, r"NV_ERR_NO_MEMORY", with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY")),
    # -- consequences: every engine death ends in these --
    rule(F.engine_dead, Q, r"Engine core proc(?:ess)? (?P<proc>\S+) died unexpectedly",
       fmt("vLLM's engine core process {proc} died")),
    rule(F.engine_dead, Q, r"\[shutdown\] MPClient: engine core exited unexpectedly",
       const("vLLM's engine core process exited unexpectedly (its API server saw it die: killed or crashed)")),
    # a worker ended by SIGTERM or SIGINT was stopped (by vLLM's own shutdown or from outside): what stopped it is
    # the cause, the death only its fallout
    rule(F.engine_dead, Q, r"Worker (?:proc )?(?P<proc>\S+) (?:pid \d+ )?died(?: unexpectedly)?,? \(?exit code:? "
       r"(?P<code>-15|-2)\b", fmt("vLLM's worker process {proc} was stopped by a signal (exit code {code})")),
    rule(F.engine_dead, G, r"Worker proc (?P<proc>\S+) died unexpectedly", fmt("vLLM's worker process {proc} died")),
    # V0's multiprocessing executor (0.5-0.10): `Worker VllmWorkerProcess pid 29 died, exit code: 1`
    rule(F.engine_dead, G, r"Worker (?P<proc>\S+) pid \d+ died, exit code: (?P<code>-?\d+)",
       fmt("vLLM's worker process {proc} died (exit code {code})")),
    rule(F.engine_dead, Q, r"RayWorkerProc rank=\[\d+\] died unexpectedly", const("A Ray worker process died")),
    rule(F.engine_dead, Q, r"EngineCore encountered a fatal error", const("vLLM's engine core hit a fatal error")),
    rule(F.engine_dead, Q,
       r"Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start|"
       r"WorkerProc initialization failed due to an exception in a background process|"
       r"Worker failed with error '|Engine process failed to start",  # the last: V0's MQLLMEngine (0.6-0.10)
       const(INIT_FAILED)),
    # the API server or the engine client on a death it did not cause: V0's MQLLMEngine, V1's 0.8 engine client
    rule(F.engine_dead, Q, r"MQLLMEngine is already dead|Got fatal signal from worker processes",
       const("vLLM's engine died (its API server saw it go)")),
    rule(F.engine_dead, Q, r"EngineDeadError|AsyncLLM output_handler failed|Engine loop has died|Background loop has "
       r"errored already",
       const("vLLM's engine died (EngineDeadError)")),
    # an outside signal to the engine core: vLLM's own shutdown (the API server's, the process manager's) always
    # comes first when vLLM stops it, and so does the error of a crash
    rule(F.engine_dead, C, r"\[shutdown\] EngineCore: trigger received signal=(?P<sig>SIG\w+)", what_engine_signal,
       ENGINE_SIGNAL_DO, unless_after=r"\[shutdown\] (?:API server|Process manager|MPClient|Executor)|[Ss]hutting "
       r"down FastAPI|Traceback \(most recent call last\)|^(?:ERROR|CRITICAL) \d\d-\d\d"),
    # the worker's INFO line on every stop, vLLM's own included: it explains a death only when nothing else does
    rule(F.engine_dead, A, r"Parent process exited, terminating worker",
       const("The worker's parent process (the engine core) went away")),
    # -- a stop from outside: only the API server's SIGTERM/SIGINT handler logs these (0.11-0.22; 0.23+), never the
    # engine core's `trigger received signal=`: vLLM's own shutdown SIGTERMs the engine core, after a crash too --
    rule(F.unknown, Q, r"\[shutdown\] API server: shutdown triggered|[Ss]hutting down FastAPI HTTP server",
       const(STOPPED_FROM_OUTSIDE), STOPPED_FROM_OUTSIDE_DO),
    # the same in a process without that handler (V0's engine, a launcher's `python -m`): Python's own word for SIGINT
    rule(F.unknown, Q, r"(?:^|\] )KeyboardInterrupt\s*$", const(INTERRUPTED), STOPPED_FROM_OUTSIDE_DO),
)
del F


def _unnamed(rule: Rule) -> str:
    body = re.sub(r"\(\?P<\w+>", "(?:", rule.pattern.pattern)
    flag = "i" if rule.pattern.flags & re.IGNORECASE else ""
    return f"(?{flag}:{body})" if flag else f"(?:{body})"


# One search with all patterns combined rejects the ordinary lines before any single rule is tried.
ANY = re.compile("|".join(_unnamed(r) for r in RULES))
