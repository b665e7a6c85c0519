"""Failure classification: why did vLLM stop, in one class and one sentence.

`classify(exit_code, signal, log_tail)` is a pure function of what the supervisor observed when a vLLM
process ended (or was ended). Rules, in order:

1. A `hint` wins. The supervisor passes one when it knows the class from elsewhere: the memory guard killed
   the process (`killed_by_guard`), a probe saw 503 (`engine_dead`), the canary or metrics saw a wedge
   (`hang`, `stall`), the peer reported its rank gone (`peer_lost`). The log is still scanned for evidence.
2. Exit 126/127 is a config error: the launch target is missing or not executable, or a command in it
   was not found. vLLM never ran, so there is no vLLM log to read.
3. Otherwise the log tail is matched against the catalogue below (reference/community-recipes.md §12,
   vllm-runtime-surface.md §3.3/§5). Each pattern has a tier:
     0 CAUSE        a specific root cause (free-memory refusal, EADDRINUSE, NCCL error, bad flag, ...)
     1 GENERIC      a cause stated generically (a pydantic ValidationError whose detail is on later lines,
                    an RPC timeout)
     2 CONSEQUENCE  what every failure ends in (`Engine core initialization failed`, `EngineDeadError`)
     3 AMBIGUOUS    a line that also shows up in healthy runs and only explains a death when nothing else
                    does (`NV_ERR_NO_MEMORY` is benign at startup with memory to spare; the TCPStore client
                    retries while the head is still booting; the shm-broadcast wait during compilation)
   The lowest tier wins; within a tier the earliest line wins, because the first specific error is the
   cause and the rest is fallout.
4. Nothing matched: exit 0 is still a failure (vLLM exits 0 after engine death) → `engine_dead`; a signal
   or other exit code → `unknown`.

Every class has one sentence template: what happened, then what to do. Facts from `ClassifyContext`
(launch target, ports, MemAvailable, peer) make it specific.

Config errors are the only class that is not restartable, so their patterns are held to a higher bar:
a shell "not found" line only counts with exit 126/127 or when it names the configured launch target.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from sparkd.supervisor.failures import TREATMENT, Failure, FailureClass
from sparkd.supervisor.logline import segments

__all__ = ["ClassifyContext", "classify"]


@dataclass(frozen=True)
class ClassifyContext:
    """Facts the supervisor knows that make a sentence actionable. All optional."""

    launch_target: str | None = None  # the script or binary the launch execs, e.g. /workspace/vllm-head.sh
    api_port: int | None = None  # vLLM's HTTP port (--port)
    master_port: int | None = None  # torch.distributed master port (--master-port)
    mem_available_bytes: int | None = None  # MemAvailable when the failure was observed
    peer: str | None = None  # the other node's address, e.g. "10.0.0.2"
    was_ready: bool | None = None  # had this instance reached ready before it ended?


class _Tier(IntEnum):
    CAUSE = 0
    GENERIC = 1
    CONSEQUENCE = 2
    AMBIGUOUS = 3


_What = Callable[[re.Match[str], ClassifyContext], str]


@dataclass(frozen=True)
class _Rule:
    cls: FailureClass
    tier: _Tier
    pattern: re.Pattern[str]
    what: _What | None = None  # the "what happened" clause; None → the class default
    do: str | None = None  # the "what to do" clause; None → the class default
    # Extra condition on the match (exit code, context); None → always.
    when: Callable[[re.Match[str], int | None, ClassifyContext], bool] | None = None


# ---- sentence pieces -------------------------------------------------------------------------------------

_NO_RETRY = "sparkd will not retry a config error"

def _default_what(cls: FailureClass) -> str:
    return TREATMENT[cls].what


def _default_do(cls: FailureClass) -> str:
    return TREATMENT[cls].do


_GIB = 1024**3


def _gib(n: int) -> str:
    return f"{n / _GIB:.1f} GiB"


def _mem_note(ctx: ClassifyContext) -> str:
    if ctx.mem_available_bytes is None:
        return ""
    return f", with {_gib(ctx.mem_available_bytes)} MemAvailable"


def _port_name(port: int, ctx: ClassifyContext) -> str:
    if ctx.master_port is not None and port == ctx.master_port:
        return f"the torch.distributed master port {port}"
    if ctx.api_port is not None and port == ctx.api_port:
        return f"the API port {port}"
    if port in (29500, 29501):
        return f"the torch.distributed master port {port}"
    return f"port {port}"


def _peer_note(ctx: ClassifyContext) -> str:
    return f" at {ctx.peer}" if ctx.peer else ""


# ---- "what happened" builders for rules with facts in their match ----------------------------------------


def _what_unrecognized(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"vLLM does not know the argument(s) {m.group('args').strip()}"


def _what_argparse(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"vLLM rejected the argument {m.group('arg')}: {m.group('msg').strip()}"


def _what_required(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"vLLM is missing required argument(s) {m.group('args').strip()}"


def _what_max_model_len(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"max_model_len {m.group('want')} is larger than the model allows: {m.group('derived')}"


def _what_dspark(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The DSpark patch rejected the configuration: it requires uniform {m.group('rest').rstrip('.')}"


def _what_validation(m: re.Match[str], ctx: ClassifyContext) -> str:
    model = m.group("model")
    return f"vLLM's {model} rejected a setting, named on the log lines that follow"


def _what_kv_too_small(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (
        f"The KV cache cannot hold one request of max_model_len {m.group('len')}: it needs "
        f"{m.group('need')} GiB and only {m.group('have')} GiB is left"
    )


def _what_missing_path(m: re.Match[str], ctx: ClassifyContext) -> str:
    path = m.group("path")
    if ctx.launch_target and path == ctx.launch_target:
        return f"The launch target {path} does not exist"
    return f"{path} does not exist"


def _what_not_found(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The command {m.group('cmd')} was not found"


def _what_oci(m: re.Match[str], ctx: ClassifyContext) -> str:
    path, why = m.group("path"), m.group("why").lower()
    if why.startswith("permission"):
        return f"Docker could not execute {path} (permission denied)"
    if why.startswith("executable"):
        return f"Docker could not find {path} on the container's PATH"
    return f"{path} does not exist in the container"


def _what_free_memory(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (
        f"vLLM refused to start: only {m.group('free')} of {m.group('total')} GiB was free and it wants "
        f"{m.group('want')} GiB at gpu_memory_utilization {m.group('util')}{_mem_note(ctx)}"
    )


def _what_cuda_oom(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"CUDA ran out of memory{_mem_note(ctx)}"


def _what_weights_oom(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"vLLM ran out of memory while loading the weights{_mem_note(ctx)}"


def _what_nvrm(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The NVIDIA driver reported NV_ERR_NO_MEMORY{_mem_note(ctx)}"


def _what_kernel_oom(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The kernel OOM killer killed {m.group('comm')}{_mem_note(ctx)}"


def _what_earlyoom(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"earlyoom sent {m.group('sig')} to vLLM because memory ran low{_mem_note(ctx)}"


def _what_port(m: re.Match[str], ctx: ClassifyContext) -> str:
    port = m.groupdict().get("port")
    if port is None:
        return _default_what(FailureClass.port_in_use)
    name = _port_name(int(port), ctx)
    return f"{name[0].upper()}{name[1:]} was already in use"


def _what_store_timeout(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (
        f"The head waited {m.group('secs')} s for the worker to join the rendezvous and only "
        f"{m.group('joined')}/{m.group('want')} ranks arrived"
    )


def _what_client_timeout(m: re.Match[str], ctx: ClassifyContext) -> str:
    return (
        f"The worker could not reach the head's rendezvous at {m.group('host')}:{m.group('port')} "
        f"for {int(m.group('ms')) // 1000} s"
    )


def _what_client_retry(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The worker kept failing to reach the head's rendezvous at {m.group('addr')}"


def _what_peer(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"The peer rank{_peer_note(ctx)} went away: its TCPStore connection closed"


def _what_nccl_remote(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"NCCL lost the peer rank{_peer_note(ctx)}: the remote process exited or the network failed"


def _what_nccl(m: re.Match[str], ctx: ClassifyContext) -> str:
    return f"NCCL failed: {m.group('msg').strip().rstrip('.')}"


def _const(text: str) -> _What:
    return lambda m, ctx: text


def _exit_127_or_target(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    if exit_code in (126, 127):
        return True
    path = m.groupdict().get("path") or m.groupdict().get("cmd")
    return bool(ctx.launch_target) and path == ctx.launch_target


# "the fatal pattern is the same line with MemAvailable under ~10 GiB" (community-recipes.md §11).
NVRM_LOW_MEMORY_BYTES = 10 * 1024**3


def _memory_was_low(m: re.Match[str], exit_code: int | None, ctx: ClassifyContext) -> bool:
    return ctx.mem_available_bytes is not None and ctx.mem_available_bytes < NVRM_LOW_MEMORY_BYTES


def _r(
    cls: FailureClass,
    tier: _Tier,
    pattern: str,
    what: _What | None = None,
    do: str | None = None,
    *,
    flags: int = 0,
    when: Callable[[re.Match[str], int | None, ClassifyContext], bool] | None = None,
) -> _Rule:
    return _Rule(cls, tier, re.compile(pattern, flags), what, do, when)


_C, _G, _Q, _A = _Tier.CAUSE, _Tier.GENERIC, _Tier.CONSEQUENCE, _Tier.AMBIGUOUS
F = FailureClass

# Order matters only between rules that can match the same line: the first one listed wins for that line.
_RULES: tuple[_Rule, ...] = (
    # -- config errors (never retried) --
    _r(F.config_error, _C, r"unrecognized arguments: (?P<args>--.*)", _what_unrecognized,
       f"remove or fix them in the config's vLLM flags — {_NO_RETRY}"),
    _r(F.config_error, _C, r": error: argument (?P<arg>[^:]+): (?P<msg>.+)", _what_argparse,
       f"fix the vLLM flags in the config — {_NO_RETRY}"),
    _r(F.config_error, _C, r": error: the following arguments are required: (?P<args>.+)", _what_required,
       f"add them to the config's vLLM flags — {_NO_RETRY}"),
    _r(F.config_error, _C,
       r"User-specified max_model_len \((?P<want>\d+)\) is greater than the derived max_model_len "
       r"\((?P<derived>[^)]*)\)", _what_max_model_len,
       f"lower max_model_len in the config (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check, at your own "
       f"risk) — {_NO_RETRY}"),
    _r(F.config_error, _C, r"DSpark currently requires uniform (?P<rest>.*)", _what_dspark,
       f"fix the DSpark settings in the config — {_NO_RETRY}"),
    _r(F.config_error, _C,
       r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the "
       r"available KV cache memory \((?P<have>[\d.]+) GiB\)", _what_kv_too_small,
       f"lower max_model_len or raise gpu_memory_utilization in the config — {_NO_RETRY}"),
    _r(F.config_error, _C, r"No available memory for the cache blocks",
       _const("The weights leave no memory for the KV cache"),
       f"raise gpu_memory_utilization or use a smaller model or quantization in the config — {_NO_RETRY}"),
    _r(F.config_error, _C, r"can't open file '(?P<path>[^']+)': \[Errno 2\] No such file or directory",
       _what_missing_path, f"fix [launch] in the config — {_NO_RETRY}"),
    _r(F.config_error, _C,
       r"OCI runtime \w+ failed: .*?exec: \"(?P<path>[^\"]+)\": (?:stat \S+: )?"
       r"(?P<why>no such file or directory|executable file not found in \$PATH|permission denied)",
       _what_oci, f"fix [launch] in the config — {_NO_RETRY}", flags=re.IGNORECASE),
    _r(F.config_error, _C,
       r"^(?:\S*/)?(?:ba|da|z)?sh: (?:line \d+: |\d+: )?(?:exec: )?(?P<path>[^:]+): "
       r"(?:No such file or directory|not found|Permission denied)\s*$",
       _what_missing_path, f"fix [launch] in the config — {_NO_RETRY}", when=_exit_127_or_target),
    _r(F.config_error, _C, r"(?P<cmd>[^\s:]+): command not found", _what_not_found,
       f"fix [launch] in the config or the image — {_NO_RETRY}", when=_exit_127_or_target),
    _r(F.config_error, _G, r"\d+ validation errors? for (?P<model>\w+)", _what_validation),
    # -- startup memory check --
    _r(F.free_memory_refusal, _C,
       r"Free memory on device (?:cuda:\d+ )?\((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is "
       r"less than desired GPU memory utilization \((?P<util>[\d.]+), (?P<want>[\d.]+) GiB\)",
       _what_free_memory),
    # -- out of memory --
    _r(F.oom, _C, r"Failed to load model - not enough GPU memory", _what_weights_oom),
    _r(F.oom, _C, r"CUDA out of memory|OutOfMemoryError", _what_cuda_oom),
    _r(F.oom, _C, r"Out of memory: Killed process \d+ \((?P<comm>[^)]*)\)", _what_kernel_oom),
    _r(F.oom, _C, r"earlyoom.*sending (?P<sig>SIG\w+) to process", _what_earlyoom, flags=re.IGNORECASE),
    _r(F.oom, _C, r"OOMKilled[\"']?:?\s*true", _const("Docker reports the container was OOM-killed")),
    # -- ports --
    _r(F.port_in_use, _C, r"failed to listen on any local network address\. port: (?P<port>\d+).*EADDRINUSE",
       _what_port),
    _r(F.port_in_use, _C, r"failed to bind to \S*?:(?P<port>\d+) \(errno: 98", _what_port),
    _r(F.port_in_use, _C, r"bind on address \('[^']*', (?P<port>\d+)\)\)?: address already in use",
       _what_port, flags=re.IGNORECASE),
    _r(F.port_in_use, _C, r"EADDRINUSE|\[Errno 98\]|Address already in use", _what_port, flags=re.IGNORECASE),
    # -- GPU held by a stale process --
    _r(F.gpu_busy, _C, r"CUDA-capable device\(s\) is/are busy or unavailable"),
    # -- rendezvous --
    _r(F.rendezvous_timeout, _C,
       r"Timed out after (?P<secs>\d+) seconds waiting for clients\. "
       r"(?P<joined>\d+)/(?P<want>\d+) clients joined",
       _what_store_timeout),
    _r(F.rendezvous_timeout, _C,
       r"client socket has timed out after (?P<ms>\d+)ms while trying to connect to "
       r"\((?P<host>[^,]+), (?P<port>\d+)\)", _what_client_timeout),
    _r(F.rendezvous_timeout, _C, r"Timed out waiting \d+ms for send operation to complete",
       _const("A gloo send to the other rank timed out during distributed init")),
    _r(F.rendezvous_timeout, _A, r"TCP client failed to connect/validate to host (?P<addr>\S+?) - retrying",
       _what_client_retry),
    # -- peer lost (before the NCCL patterns: the "remote process exited" NCCL error is a peer loss) --
    _r(F.peer_lost, _C, r"NCCL error: remote process exited or there was a network error", _what_nccl_remote),
    _r(F.peer_lost, _C,
       r"recvValue failed .*Connection was likely closed\. Did the remote server shutdown or crash",
       _what_peer),
    _r(F.peer_lost, _C, r"Failed to check the \"should dump\" flag on TCPStore", _what_peer),
    _r(F.peer_lost, _C, r"TCPStore server has shut down", _what_peer),
    _r(F.peer_lost, _C, r"ProcessGroupNCCL.*HeartbeatMonitor", _what_peer),
    # -- NCCL / RDMA --
    _r(F.nccl, _C, r"(?P<msg>NCCL WARN .*unhandled system error.*)", _what_nccl),
    _r(F.nccl, _C, r"(?P<msg>ibv_reg_mr_iova2.*Cannot allocate memory.*)", _what_nccl),
    _r(F.nccl, _C, r"(?P<msg>NET/IB .* failed.*)", _what_nccl),
    _r(F.nccl, _C, r"(?P<msg>failed to extend /dev/shm/nccl-.*No space left on device.*)", _what_nccl),
    _r(F.nccl, _C, r"(?P<msg>Watchdog caught collective operation timeout)", _what_nccl),
    _r(F.nccl, _C, r"(?P<msg>ProcessGroupNCCL's watchdog got stuck for \d+ seconds)", _what_nccl),
    _r(F.nccl, _C, r"NCCL error(?: in: [^,]*,)?:? (?P<msg>[^(\n]+)", _what_nccl),
    # -- wedges and startup timeouts --
    _r(F.hang, _G, r"RPC call to (?P<rpc>\w+) timed out",
       lambda m, ctx: f"A rank stopped answering: the RPC call to {m.group('rpc')} timed out"),
    _r(F.hang, _G, r"Timed out waiting for engine(?:s to send initial message| core processes to start)",
       _const("vLLM gave up waiting for its engine to start after VLLM_ENGINE_READY_TIMEOUT_S"),
       "raise VLLM_ENGINE_READY_TIMEOUT_S if loading is just slow — sparkd restarts with backoff"),
    _r(F.hang, _A, r"No available shared memory broadcast block found in \d+ seconds",
       _const("A rank stopped consuming the shared-memory broadcast queue")),
    # -- the driver's out-of-memory line: a cause when MemAvailable was low, else benign startup noise --
    _r(F.oom, _C, r"NV_ERR_NO_MEMORY", _what_nvrm, when=_memory_was_low),
    _r(F.oom, _A, r"NV_ERR_NO_MEMORY", _what_nvrm),
    # -- consequences: every engine death ends in these --
    _r(F.engine_dead, _Q, r"Engine core proc (?P<proc>\S+) died unexpectedly",
       lambda m, ctx: f"vLLM's engine core process {m.group('proc')} died"),
    _r(F.engine_dead, _Q, r"Worker proc (?P<proc>\S+) died unexpectedly",
       lambda m, ctx: f"vLLM's worker process {m.group('proc')} died"),
    _r(F.engine_dead, _Q, r"RayWorkerProc rank=\[\d+\] died unexpectedly",
       _const("A Ray worker process died")),
    _r(F.engine_dead, _Q, r"EngineCore encountered a fatal error",
       _const("vLLM's engine core hit a fatal error")),
    _r(F.engine_dead, _Q,
       r"Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start",
       _const("vLLM's engine failed to start and no earlier cause is in the log tail")),
    _r(F.engine_dead, _Q, r"EngineDeadError", _const("vLLM's engine died (EngineDeadError)")),
    _r(F.engine_dead, _Q, r"Parent process exited, terminating worker",
       _const("The worker's parent process (the engine core) went away")),
)
del F


def _unnamed(rule: _Rule) -> str:
    body = re.sub(r"\(\?P<\w+>", "(?:", rule.pattern.pattern)
    flag = "i" if rule.pattern.flags & re.IGNORECASE else ""
    return f"(?{flag}:{body})" if flag else f"(?:{body})"


# One search with all patterns combined rejects the ordinary lines before any single rule is tried.
_ANY = re.compile("|".join(_unnamed(r) for r in _RULES))

# For `unknown`: the last line that looks like an error is the best evidence there is.
_ERRORISH = re.compile(r"\b(?:\w*Error|\w*Exception|Traceback|FATAL|Fatal|ERROR)\b")

# Only the tail matters, and a supervisor may hand over a long buffer.
MAX_SCAN_LINES = 2000
_MAX_EVIDENCE_CHARS = 500


@dataclass(frozen=True)
class _Match:
    rule: _Rule
    match: re.Match[str]
    text: str


def _scan(
    log_tail: Sequence[str], exit_code: int | None, ctx: ClassifyContext
) -> tuple[_Match | None, str | None]:
    """The root-cause match (lowest tier, then earliest) and the last error-looking line."""
    best: _Match | None = None
    best_key: tuple[int, int] | None = None
    last_errorish: str | None = None
    start = max(0, len(log_tail) - MAX_SCAN_LINES)
    for index in range(start, len(log_tail)):
        for text in segments(log_tail[index]):
            if _ERRORISH.search(text):
                last_errorish = text
            if not _ANY.search(text):
                continue
            for rule in _RULES:
                m = rule.pattern.search(text)
                if m is None or (rule.when is not None and not rule.when(m, exit_code, ctx)):
                    continue
                key = (int(rule.tier), index)
                if best_key is None or key < best_key:
                    best, best_key = _Match(rule, m, text), key
                break  # first listed rule wins for a line
    return best, last_errorish


def _signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _how(exit_code: int | None, sig: int | None) -> str | None:
    if sig is not None:
        return f"killed by {_signal_name(sig)}"
    if exit_code is not None:
        return f"exit {exit_code}"
    return None


def _sentence(what: str, how: str | None, do: str) -> str:
    middle = f" ({how})" if how else ""
    return f"{what}{middle}; {do}."


def _evidence(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= _MAX_EVIDENCE_CHARS else text[: _MAX_EVIDENCE_CHARS - 1] + "…"


def _launch_error(exit_code: int, hit: _Match | None, ctx: ClassifyContext) -> tuple[str, str]:
    """What and do for exit 126/127, preferring a log line that names the culprit."""
    if hit is not None and hit.rule.cls is FailureClass.config_error and hit.rule.what is not None:
        return hit.rule.what(hit.match, ctx), hit.rule.do or _default_do(FailureClass.config_error)
    target = ctx.launch_target
    do = f"fix [launch] in the config — {_NO_RETRY}"
    if exit_code == 126:
        name = f"The launch target {target}" if target else "The launch target"
        return f"{name} is not executable", f"make it executable or fix [launch] in the config — {_NO_RETRY}"
    if target:
        return f"The launch target {target} does not exist", do
    return "The launch target or a command it runs does not exist", do


def classify(
    exit_code: int | None,
    signal: int | None,
    log_tail: Sequence[str],
    *,
    hint: FailureClass | None = None,
    context: ClassifyContext | None = None,
) -> Failure:
    """Classify one ended vLLM process.

    `exit_code` and `signal` are as observed (a Popen returncode of -N is `signal=N`); an exit code of 128+N
    with no signal is read as death by signal N, the way shells and `docker exec` report it. `log_tail` is
    the last lines of the process's output, raw (colour, process prefixes and `\\r` frames are handled here).
    """
    ctx = context or ClassifyContext()
    sig = signal
    if sig is None and exit_code is not None and 128 < exit_code <= 128 + 64:
        sig = exit_code - 128
    how = _how(exit_code, sig)
    hit, last_errorish = _scan(log_tail, exit_code, ctx)

    def failure(
        cls: FailureClass, what: str, do: str, evidence: str | None, with_how: bool = True
    ) -> Failure:
        sentence = _sentence(what, how if with_how else None, do)
        return Failure(cls, sentence, exit_code, sig, _evidence(evidence))

    if hint is not None:
        evidence = hit.text if hit is not None else None
        if hit is not None and hit.rule.cls is hint and hit.rule.what is not None:
            return failure(hint, hit.rule.what(hit.match, ctx), hit.rule.do or _default_do(hint), evidence)
        what = _default_what(hint)
        if hint in (FailureClass.oom, FailureClass.killed_by_guard):
            what += _mem_note(ctx)
        return failure(hint, what, _default_do(hint), evidence)

    if exit_code in (126, 127) and signal is None:
        what, do = _launch_error(exit_code, hit, ctx)
        return failure(FailureClass.config_error, what, do, hit.text if hit is not None else None)

    if hit is not None:
        rule = hit.rule
        what = rule.what(hit.match, ctx) if rule.what is not None else _default_what(rule.cls)
        return failure(rule.cls, what, rule.do or _default_do(rule.cls), hit.text)

    if exit_code == 0 and sig is None:
        if ctx.was_ready is False:
            what = "vLLM exited with status 0 before it was ready and logged no error"
        else:
            what = "vLLM exited with status 0 without being asked to, which it does after its engine dies"
        return failure(FailureClass.engine_dead, what, _default_do(FailureClass.engine_dead), last_errorish,
                       with_how=False)

    if sig is not None:
        what = (
            f"vLLM was killed by {_signal_name(sig)} from outside sparkd "
            "(the kernel OOM killer, earlyoom or a person)"
        )
        do = "check the kernel log (`journalctl -k`) for an OOM kill — sparkd restarts with backoff"
        return failure(FailureClass.unknown, what, do, last_errorish, with_how=False)

    what = _default_what(FailureClass.unknown)
    if exit_code is None:
        what = "vLLM went away and its exit status is unknown"
    return failure(FailureClass.unknown, what, _default_do(FailureClass.unknown), last_errorish)
