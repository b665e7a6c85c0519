"""The facts a classification may use beyond the log: what the supervisor knows that makes a sentence
actionable (the launch target, the ports, MemAvailable, the kernel's lines, Docker's OOMKilled). Pure data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClassifyContext"]


@dataclass(frozen=True)
class ClassifyContext:
    """Facts the supervisor knows that make a sentence actionable. All optional."""

    launch_target: str | None = None  # the script or binary the launch execs, e.g. /workspace/vllm-head.sh
    api_port: int | None = None  # vLLM's HTTP port (--port)
    master_port: int | None = None  # torch.distributed master port (--master-port)
    mem_available_bytes: int | None = None  # MemAvailable when the failure was observed (the guard's sample)
    peer: str | None = None  # the other node's address, e.g. "10.0.0.2"
    # Does the launch span nodes? True: a group (nnodes > 1, or peers); False: this node runs vLLM alone, so a rank it
    # loses is a process of its own, never a peer; None: not known (a pasted log, a user's launch script).
    group: bool | None = None
    was_ready: bool | None = None  # had this instance reached ready before it ended?
    # Kernel-log lines written since this instance launched: NVRM, Xid, PCIe AER, and OOM kills of its processes.
    kernel_lines: tuple[str, ...] = ()
    oom_killed: bool | None = None  # Docker's State.OOMKilled for the instance's container (docker-run)
    engine_gone: bool = False  # the container engine vLLM ran under took no new connection when it ended
    # Is how the process ended known? False: a log read without it (`sparkd explain` with no --exit-code nor
    # --signal), whose process may still run. The daemon classifies only processes that ended: no exit status
    # there means one that went away unseen.
    ended_known: bool = True
