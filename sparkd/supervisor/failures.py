"""Failure classes and how the supervisor treats each one: one table, read by the restart policy, the
lifecycle machine, the pair coordinator and the incident writer. Pure.

A :class:`Failure` is one ended (or refused) launch: its class, the sentence an operator reads, and the
facts it rests on. :func:`Failure.of` is the one way to make one.

Rules of the table (:data:`TREATMENT`):

1. ``restartable`` False: the same launch fails the same way every time (a config error, an image that lacks
   a module or library), so the breaker opens at once.
2. ``budget``: what a failure costs in the restart budget. ``one``: one strike. ``guard_kill``: the
   configured ``guard_kill_weight`` (memory-guard kills open the breaker faster). ``none``: sparkd waits for
   something outside vLLM (the peer node, the Docker engine); the delay grows as after a failure, but the
   budget is not spent and the breaker never opens.
3. ``scope``: where the cause lies. ``node``: on this node (memory, ports, config, the image). ``pair``: between
   the ranks (the link, the peer, the rendezvous); a pair's head waits for the peer instead of blaming it.
4. ``evidence``: what an incident folder holds beyond the log tail and the record.
5. ``what`` and ``do``: the default sentence, "what happened; what to do", used when no log line names more.
6. ``policy``: the acceptance gate's verdicts (issue 37) name the ``[acceptance]`` key that decides them. They never
   reach the restart policy: vLLM is left running, held in ``accepting`` (``refuse``) or serving ``degraded``
   (``warn``, or found while serving), never stopped for them (:mod:`sparkd.supervisor.lifecycle` rules 7 to 9).
   ``restartable`` False is the net should one ever reach it: the breaker, never a restart loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["CAUSES", "TREATMENT", "WEDGED", "Budget", "Cause", "Evidence", "Failure", "FailureClass", "Scope",
           "Treatment", "treatment", "wedged"]


class FailureClass(StrEnum):
    config_error = "config_error"  # the launch itself is wrong; retrying cannot help
    image_error = "image_error"  # the image lacks a module, library or symbol vLLM needs; retrying cannot help
    free_memory_refusal = "free_memory_refusal"  # vLLM's startup check: not enough free memory
    oom = "oom"  # ran out of memory (CUDA OOM, NVRM, kernel or earlyoom kill)
    port_in_use = "port_in_use"  # EADDRINUSE on the API or master port
    rendezvous_timeout = "rendezvous_timeout"  # the ranks never met in torch.distributed init
    peer_lost = "peer_lost"  # the other rank went away (TCPStore closed)
    nccl = "nccl"  # NCCL/RDMA error or collective timeout
    engine_dead = "engine_dead"  # the engine core or a worker died
    stall = "stall"  # requests running, tokens not moving (probe)
    hang = "hang"  # not answering: RPC timeout, wedged TP pair (probe or log)
    killed_by_guard = "killed_by_guard"  # sparkd's memory guard killed it
    gpu_busy = "gpu_busy"  # CUDA device busy: a stale process holds the GPU
    gpu_error = "gpu_error"  # the GPU or its PCIe link faulted: an Xid, a fatal AER, an uncorrectable ECC error
    host_unavailable = "host_unavailable"  # what a launch needs from the host is missing (engine, disk): wait
    reboot_needed = "reboot_needed"  # restarts keep losing memory the driver never returns: only a reboot helps
    answers_changed = "answers_changed"  # the acceptance gate: the answers differ from the golden's
    answers_garbled = "answers_garbled"  # the acceptance gate: garbled answers, or NaNs in the logits
    capacity_lost = "capacity_lost"  # the acceptance gate: less KV cache than expected, or an idle speculative decoder
    unknown = "unknown"  # nothing recognised


class Budget(StrEnum):
    one = "one"  # one strike toward the restart budget
    guard_kill = "guard_kill"  # the configured guard_kill_weight
    none = "none"  # waiting, not failing: no strike, the breaker never opens


class Scope(StrEnum):
    node = "node"  # the cause is on this node
    pair = "pair"  # the cause is between the ranks: the link, the peer, the rendezvous


class Evidence(StrEnum):
    meminfo = "meminfo"  # /proc/meminfo at the time
    kernel_log = "kernel_log"  # the kernel log's tail (OOM kills, NVRM, Xid, AER)
    container = "container"  # docker inspect of vLLM's container, when there is one
    guard = "guard"  # the memory guard's latest samples and trend


@dataclass(frozen=True, kw_only=True)
class Treatment:
    restartable: bool
    budget: Budget
    scope: Scope
    evidence: frozenset[Evidence]
    what: str  # "what happened", when nothing more specific is known
    do: str  # "what to do", and what sparkd does about it
    policy: str | None = None  # the acceptance gate's: the [acceptance] key that decides refuse or warn (rule 6)


_NO_RETRY = "sparkd will not retry a config error"
_NO_RETRY_IMAGE = "sparkd will not retry an image error"
BASIC = frozenset({Evidence.meminfo, Evidence.container})  # every incident's
FULL = BASIC | {Evidence.kernel_log, Evidence.guard}  # where memory, the driver or the kernel may be the cause

TREATMENT: dict[FailureClass, Treatment] = {
    FailureClass.config_error: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=BASIC,
        what="vLLM's configuration was rejected",
        do=f"fix the config — {_NO_RETRY}"),
    FailureClass.image_error: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=BASIC,
        what="vLLM's image lacks a module, library or symbol it needs",
        do=f"fix or rebuild the image — {_NO_RETRY_IMAGE}"),
    FailureClass.free_memory_refusal: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="vLLM refused to start because too little memory was free",
        do="page cache or a stale process holds memory — sparkd drops caches, sweeps stale vLLM processes and "
           "waits for headroom before the next start; if it repeats, lower gpu_memory_utilization or reboot the "
           "node"),
    FailureClass.oom: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="vLLM ran out of memory",
        do="if it repeats, lower gpu_memory_utilization, max_model_len or max_num_seqs — sparkd restarts with "
           "backoff once there is memory headroom again"),
    FailureClass.port_in_use: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=BASIC,
        what="A port vLLM needs was already in use",
        do="an orphaned VLLM::* process or an old container usually holds it — sparkd sweeps stale processes "
           "before the next start; if another program (or another vLLM) owns the port, change the port in the "
           "config"),
    FailureClass.rendezvous_timeout: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.pair, evidence=BASIC,
        what="The ranks never met at the torch.distributed rendezvous",
        do="check that every node's rank is up and that the head address and master port are reachable over "
           "the interconnect (after a reboot, re-check the RoCE GID index) — sparkd restarts every rank, "
           "workers first"),
    FailureClass.peer_lost: Treatment(
        restartable=True, budget=Budget.none, scope=Scope.pair, evidence=FULL,
        what="The peer rank went away",
        do="if the peer host no longer answers ssh it may be frozen by memory exhaustion and need a power cycle "
           "— sparkd restarts the group once the peer is back"),
    FailureClass.nccl: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.pair, evidence=FULL,
        what="NCCL failed",
        do="check the interconnect (link state, RoCE GID index), /dev/shm space and CmaFree — sparkd restarts "
           "every rank with backoff"),
    FailureClass.engine_dead: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="The vLLM engine died",
        do="sparkd restarts every rank with backoff; the log tail in the incident folder shows what led to it"),
    FailureClass.stall: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.pair, evidence=BASIC,
        what="vLLM stopped producing tokens while requests were running",
        do="the tensor-parallel group is likely wedged — sparkd restarts every rank"),
    FailureClass.hang: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.pair, evidence=FULL,
        what="vLLM stopped answering",
        do="the tensor-parallel group is likely wedged (NCCL or the peer) — sparkd restarts every rank"),
    FailureClass.killed_by_guard: Treatment(
        restartable=True, budget=Budget.guard_kill, scope=Scope.node, evidence=FULL,
        what="sparkd's memory guard killed vLLM because the node was running out of memory",
        do="guard kills weigh extra toward the restart budget; find what grows (the UCX cache leak: "
           "UCX_MEM_MMAP_HOOK_MODE=none) or lower gpu_memory_utilization"),
    FailureClass.gpu_busy: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=BASIC,
        what="CUDA reported the GPU busy or unavailable",
        do="a stale vLLM process from an earlier run still holds the GPU — sparkd sweeps stale processes and "
           "waits for the GPU to be free before the next start"),
    FailureClass.gpu_error: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="The GPU or its PCIe link reported a fault",
        do="check `nvidia-smi` and `journalctl -k`; after Xid 79, a GSP error or a fatal PCIe AER the node needs a "
           "reboot or a power cycle — sparkd restarts with backoff and stops at the restart breaker"),
    FailureClass.host_unavailable: Treatment(
        restartable=True, budget=Budget.none, scope=Scope.node, evidence=BASIC,
        what="sparkd cannot launch vLLM on this node right now",
        do="sparkd waits for it (the Docker engine to answer, the state directory to take writes) and tries "
           "again with backoff, without spending the restart budget"),
    FailureClass.reboot_needed: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="Restarts of vLLM kept losing memory that was never returned",
        do="reboot the node (the driver keeps memory a killed vLLM held), then `sparkctl reset` — sparkd stops "
           "restarting before the host freezes"),
    # The acceptance gate's verdicts (sparkd/supervisor/acceptance/gate.py): vLLM is left running and never restarted
    # for them (a restart gives the same answers); the operator fixes the cause or records the new answers.
    FailureClass.answers_changed: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=BASIC, policy="on_wrong_answers",
        what="vLLM's answers to the acceptance prompts differ from the golden",
        do="the incident quotes the golden answer and the new one, and names what changed since the golden (the "
           "image, the weights, the flags); find the cause, or if the change was intended, `sparkctl accept` records "
           "the new answers as the golden and lets it serve"),
    FailureClass.answers_garbled: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=BASIC, policy="on_wrong_answers",
        what="vLLM answers with garbled text, or with NaNs in its logits",
        do="check the image, the kernels and the quantization (the incident quotes the answer), then `sparkctl "
           "restart`; `sparkctl accept` never records a garbled answer"),
    FailureClass.capacity_lost: Treatment(
        restartable=False, budget=Budget.one, scope=Scope.node, evidence=FULL, policy="on_lost_performance",
        what="vLLM serves with less capacity than expected (KV cache, or speculative decoding)",
        do="memory the driver kept, a changed gpu_memory_utilization or a drafter that no longer accepts — the "
           "sentence names how much; free it (a reboot returns what the driver kept) or widen [acceptance] "
           "kv_cache_tokens, then `sparkctl restart`"),
    FailureClass.unknown: Treatment(
        restartable=True, budget=Budget.one, scope=Scope.node, evidence=FULL,
        what="vLLM stopped without a recognised error",
        do="the log tail is in the incident folder — sparkd restarts with backoff"),
}

# The verdicts that say vLLM is wedged, not draining: a stop that answers one gets `hung_stop_grace_s`, not the drain
# grace (a rank spinning in a collective whose peer died ignores SIGTERM: tests/gpu/README.md).
WEDGED = frozenset({FailureClass.hang, FailureClass.stall, FailureClass.peer_lost})


class Cause(StrEnum):
    """What the head's group checks (fabric, weights) refuse a start for."""

    link_down = "link_down"
    peer_unreachable = "peer_unreachable"
    mtu = "mtu"
    path_mtu = "path_mtu"
    speed = "speed"
    gid_index = "gid_index"
    master_port = "master_port"
    bandwidth = "bandwidth"
    weights = "weights"


C, F = Cause, FailureClass
# Each cause's class by its nature: config_error when only a person can fix it (no retry loop), host_unavailable
# when it may come back by itself (wait, without spending the budget).
CAUSES: dict[Cause, tuple[FailureClass, str]] = {
    C.link_down: (F.host_unavailable, "a fabric interface is down, missing or without carrier"),
    C.peer_unreachable: (F.host_unavailable, "a peer's fabric address answers no echo at all"),
    C.mtu: (F.config_error, "the MTUs of the two ends differ, or differ from [fabric] mtu"),
    C.path_mtu: (F.config_error, "a don't-fragment echo at the MTU is lost while a small one passes"),
    C.speed: (F.config_error, "the link speeds differ, or are below [fabric] min_speed_mbps"),
    C.gid_index: (F.config_error, "NCCL_IB_GID_INDEX is not the RoCE v2 GID of the fabric address"),
    C.master_port: (F.config_error, "a worker cannot connect to the master port over the fabric"),
    C.bandwidth: (F.config_error, "the measured bandwidth is below [fabric] min_bandwidth_gbps"),
    C.weights: (F.config_error, "a file of the model directory differs between nodes"),
}
del C, F


def treatment(cls: FailureClass) -> Treatment:
    return TREATMENT[cls]


def wedged(failure: Failure | None) -> bool:
    return failure is not None and failure.cls in WEDGED


@dataclass(frozen=True)
class Failure:
    cls: FailureClass
    sentence: str
    exit_code: int | None
    signal: int | None  # as passed in, or derived from a 128+N exit code
    evidence: str | None  # the log line the class rests on (undecorated), if any

    @classmethod
    def of(cls, failure_class: FailureClass, sentence: str, *, evidence: str | None = None,
           exit_code: int | None = None, signal: int | None = None) -> Failure:
        """The one way to make a failure that no exit produced (a preflight, a probe, the peer, the guard)."""
        return cls(failure_class, sentence, exit_code, signal, evidence)

    @property
    def treatment(self) -> Treatment:
        return TREATMENT[self.cls]

    @property
    def restartable(self) -> bool:
        return self.treatment.restartable
