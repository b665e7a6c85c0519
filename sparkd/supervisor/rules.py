"""The classifier's phrase rules: the lines whose meaning is not what kind of failure they state but when and where
they were said — decided with the exit code, the launch target, the memory sample, the lines before them or their
repetition — and the lines that say how vLLM ended rather than why. What a failure IS (memory, a port, the image, the
configuration, the GPU, the ranks, NCCL) is read by the families (`families.py`), not here.

What is left here, and why it is no family:

- a shell's "not found" or "command not found": the launch target's fault only with exit 126/127 or when it names
  the configured target (`when`), else a command a script ran;
- an Xid: its number decides between a GPU that needs a reset and a kernel that faulted (NVIDIA's catalogue, by group:
  `devicecodes.py`), and the driver's recovery action (Xid 154) after it says what the GPU needs now;
- the waits (the TCPStore client's retries, Ray's placement-group wait, the shared-memory queue's wait) and vLLM's
  throughput line with no token: lines of healthy runs too, which explain a death only when nothing else does, and
  whose last one says how long the wait was (tier AMBIGUOUS, `cause._later_wait`);
- the driver's NV_ERR_NO_MEMORY: a cause when MemAvailable was low (`when`), startup noise otherwise;
- the consequences (`Engine core initialization failed`, `EngineDeadError`, a worker's death): every failure ends in
  them, they say that vLLM died, not why;
- a stop from outside (the API server's SIGTERM/SIGINT line, a bare KeyboardInterrupt, an outside signal to the engine
  core unless vLLM's own shutdown came first: `unless_after`): how vLLM was ended, which is no failure of it.

Every rule is a regular expression over one undecorated log line (colour, process prefixes and tqdm frames removed by
`logline`), a failure class, a tier, and the two halves of the sentence: "what happened" (built from the match and the
`ClassifyContext` facts) and "what to do".

Tiers (the lowest wins; within a tier the earliest line):
  0 CAUSE        a specific root cause
  1 GENERIC      a cause stated generically (an Xid that follows from a kernel fault, a worker's death)
  2 CONSEQUENCE  what every failure ends in (`Engine core initialization failed`, `EngineDeadError`)
  3 AMBIGUOUS    a line that also shows up in healthy runs and only explains a death when nothing else does
                 (`NV_ERR_NO_MEMORY` with memory to spare, the TCPStore client's retries, the shm-broadcast wait)
"""

from __future__ import annotations

import re

from sparkd.supervisor.devicecodes import (
    XID_RECOVERY,
    xid_app_fault,
    xid_fatal,
    xid_recovery_needed,
    xid_recovery_what,
    xid_what,
)
from sparkd.supervisor.failures import FailureClass
from sparkd.supervisor.rulekit import (
    ENGINE_SIGNAL_DO,
    INIT_FAILED,
    REBUILD,
    Rule,
    Tier,
    What,
    const,
    exit_127_or_target,
    fmt,
    memory_was_low,
    rule,
    what_engine_signal,
    what_missing_path,
    with_mem,
)
from sparkd.supervisor.sentences import (
    APP_XID_DO,
    INTERRUPTED,
    LAUNCHER_STOPPED,
    NO_RETRY,
    REBOOT_DO,
    SERVICE_STOPPED,
    STOPPED_FROM_OUTSIDE,
    STOPPED_FROM_OUTSIDE_DO,
)

__all__ = ["INIT_FAILED", "REBUILD", "RULES", "Rule", "Tier", "What", "may_match"]

C, G, Q, A = Tier.CAUSE, Tier.GENERIC, Tier.CONSEQUENCE, Tier.AMBIGUOUS
F = FailureClass
_XID = r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d{1,18})\b"
# NVML's recovery action in the driver's words: `154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset
# Required)`
_XID_RECOVERY = (rf"NVRM: Xid \((?P<pci>[^)]*)\): {XID_RECOVERY}, GPU recovery action changed from \S+ \([^)]*\) to "
                 r"(?P<action>0x[0-9a-fA-F]{1,8}) \((?P<said>[^)]*)\)")

# Order matters only between rules that can match the same line: the first one listed wins for that line.
RULES: tuple[Rule, ...] = (
    # -- the launch itself: a shell's "not found" counts only with exit 126/127 or when it names the launch target --
    rule(F.config_error, C,
       r"^(?:\S*/)?(?:ba|da|z)?sh: (?:line \d+: |\d+: )?(?:exec: )?(?P<path>[^:]+): "
       r"(?:No such file or directory|not found|Permission denied)\s*$",
       what_missing_path, f"fix [launch] in the config — {NO_RETRY}", when=exit_127_or_target),
    rule(F.config_error, C, r"(?<![^\s:])(?P<cmd>[^\s:]+): command not found", fmt("The command {cmd} was not found"),
       f"fix [launch] in the config or the image — {NO_RETRY}", when=exit_127_or_target),
    # -- an Xid: its number decides whether the GPU needs a reset or a kernel faulted (devicecodes: the catalogue's
    # groups); the driver's recovery action that follows the fault's Xid says what the GPU needs now, so it is the
    # cause where it asks for one (an action of none: the GPU is usable again, no fault) --
    rule(F.gpu_error, C, _XID_RECOVERY, xid_recovery_what, REBOOT_DO, when=xid_recovery_needed, overrides=True),
    rule(F.gpu_error, C, _XID, xid_what, REBOOT_DO, when=xid_fatal),
    rule(F.gpu_error, G, _XID, xid_what, APP_XID_DO, when=xid_app_fault),
    # -- waits: lines that show up in healthy runs too and repeat while vLLM waits; the last says how long --
    rule(F.rendezvous_timeout, A, r"TCP client failed to connect/validate to host (?P<addr>\S+?) - retrying",
       fmt("The worker kept failing to reach the head's rendezvous at {addr}")),
    # Ray places every rank before vLLM starts them; vLLM's INFO line repeats while it waits (a death after it, and
    # nothing else, is ranks that never met)
    rule(F.rendezvous_timeout, A, r"Waiting for creating a placement group of specs for (?P<secs>\d+) seconds",
       fmt("Ray never placed every rank: vLLM waited {secs} s for its placement group")),
    rule(F.hang, A, r"No available shared memory broadcast block found in \d+ seconds",
       const("A rank stopped consuming the shared-memory broadcast queue")),
    # the executor's wait for a worker's answer timing out inside the shared-memory queue, read from its frame when
    # the excerpt stops before the TimeoutError (the "RPC call to ... timed out" behind it)
    rule(F.hang, G, r"shm_broadcast\.py\", line \d+, in (?:acquire_read|timeout_ms)",
       const("A rank stopped answering: the engine's wait on the shared-memory queue timed out (TimeoutError)"),
       provisional=True),
    # -- a silent wedge: vLLM's own throughput line (INFO) with requests running and no token for a whole interval --
    rule(F.stall, A, r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
       r"Running: (?P<running>[1-9]\d{0,17}) reqs",
       fmt("vLLM's throughput log shows {running} request(s) running and no token generated")),
    # the same with the requests queued and none scheduled (V0's `Pending`, V1's `Waiting`)
    rule(F.stall, A, r"Avg prompt throughput: 0\.0 tokens/s, Avg generation throughput: 0\.0 tokens/s, "
       r"Running: 0 reqs,.*?(?:Pending|Waiting): (?P<waiting>[1-9]\d{0,17}) reqs",
       fmt("vLLM's throughput log shows {waiting} request(s) waiting, none scheduled and no token generated")),
    # -- vLLM found no platform (an INFO or DEBUG line, then whatever fails on it): the image or the host does not fit,
    # and the probe's reason before it says why (the CUDA check's missing NVML, not a platform's module that is absent
    # by design); a later specific reading of the image (its compiled ops that did not load) says more --
    rule(F.image_error, G, r"No platform detected, vLLM is running on UnspecifiedPlatform",
       const("vLLM detected no platform it can run on (UnspecifiedPlatform): the build in the image does not fit this "
             "host's accelerator, or the driver's library is not visible to it"), REBUILD, provisional=True,
       because=r"\b\w+ platform is not available because(?!: No module named)|Exception happens when checking \w+ "
               r"platform: "),
    # -- the driver's out-of-memory line: a cause when MemAvailable was low, else benign startup noise --
    rule(F.oom, C, r"NV_ERR_NO_MEMORY", with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY"), when=memory_was_low),
    rule(F.oom, A, r"NV_ERR_NO_MEMORY", with_mem("The NVIDIA driver reported NV_ERR_NO_MEMORY")),
    # -- consequences: every engine death ends in these; they say that it died, not why --
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
    # vLLM-Omni's stages' engine cores say it in their own name (`StageEngineCoreProc encountered a fatal error.`)
    rule(F.engine_dead, Q, r"\w*EngineCore\w* encountered a fatal error",
         const("vLLM's engine core hit a fatal error")),
    rule(F.engine_dead, Q,
       r"Engine core initialization failed|EngineCore failed to start|WorkerProc failed to start|"
       r"WorkerProc initialization failed due to an exception in a background process|"
       r"Worker failed with error '|Engine process failed to start",  # the last: V0's MQLLMEngine (0.6-0.10)
       const(INIT_FAILED)),
    # the API server or the engine client on a death it did not cause: V0's MQLLMEngine, V1's 0.8 engine client
    rule(F.engine_dead, Q, r"MQLLMEngine is already dead|Got fatal signal from worker processes|"
       r"Engine process \(pid \d+\) died",  # the last: V0's engine client finding its engine process gone
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
    # the service manager stopping the unit, the orchestrator killing the container: a stop from outside in their words
    # (vLLM's own line for the same stop, after it, says more: provisional)
    rule(F.unknown, Q, r"^(?:systemd\[1\]: )?Stopping (?P<unit>\S+\.service)\b|\bKilling container with id\b|"
       r"\bStopping container \S+",
       const(SERVICE_STOPPED), STOPPED_FROM_OUTSIDE_DO, provisional=True),
    # torchrun's (torch elastic's) words when it is signalled: it stops its workers, whose deaths follow
    rule(F.unknown, Q, r"Received (?P<sig>\d+|SIG[A-Z]+) death signal, shutting down workers",
       fmt(LAUNCHER_STOPPED), STOPPED_FROM_OUTSIDE_DO),
    rule(F.unknown, Q, r"SignalException: Process \d+ got signal: (?P<sig>\d+|SIG[A-Z]+)", fmt(LAUNCHER_STOPPED),
       STOPPED_FROM_OUTSIDE_DO),
)
del F


# One test of all rules' literal needles rejects the ordinary lines before any rule is tried (`Rule.needles`).
_CASED = tuple(dict.fromkeys(n for r in RULES if not r.pattern.flags & re.IGNORECASE for n in r.needles))
_LOWER = tuple(dict.fromkeys(n for r in RULES if r.pattern.flags & re.IGNORECASE for n in r.needles))
_EVERY_LINE = any(not r.needles for r in RULES)  # a rule without needles is tried on every line


def may_match(text: str, low: str) -> bool:
    """Whether any rule may match the line: it holds a needle of one."""
    return _EVERY_LINE or any(n in text for n in _CASED) or any(n in low for n in _LOWER)
