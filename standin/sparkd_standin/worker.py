"""One vLLM worker (rank): distributed init, the free-memory check, loading, KV profiling, CUDA-graph capture,
and the per-request step, an all-reduce across ranks.

``WorkerRuntime`` does the work; ``worker_main`` runs it in its own process (multiproc executor) and serves the
executor's RPCs over a pipe. With one rank on one node the EngineCore runs the runtime itself (uni executor).
As in vLLM, a worker initialises its device and loads the model before it reports READY; the profile and the
warmup are RPCs.

A step blocks while a peer rank is frozen (connected, silent), as an NCCL collective does. A peer that is gone
makes it hang too (GB10 TP=2 in the field: vllm#40926, vllm#46611): nothing in vLLM's pynccl polls NCCL's async
errors, so the head's EngineCore waits for the step until its RPC timeout. ``peer_loss=error`` raises
``NCCL error: remote process exited ...`` at once instead. ``jit_after`` makes one step compile a kernel first.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import setproctitle

from sparkd_standin import control, loading, logfmt, probe, procs, sizing
from sparkd_standin.args import ServeConfig
from sparkd_standin.knobs import Knobs, phase_seconds
from sparkd_standin.rendezvous import DistError, StoreClient, StoreServer
from sparkd_standin.shm import Segment

NCCL_PEER_GONE = "NCCL error: remote process exited or there was a network error"
MIB = 1 << 20
_INIT_FRAMES = [
    ("v1/executor/multiproc_executor.py", 722, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
    ("v1/executor/multiproc_executor.py", 562, "__init__", "self.worker.init_device()"),
    ("v1/worker/worker_base.py", 326, "init_device", "self.worker.init_device()  # type: ignore"),
]
_DIST_FRAMES = [
    ("v1/worker/gpu_worker.py", 235, "init_device", "init_worker_distributed_environment("),
    ("distributed/parallel_state.py", 1213, "init_distributed_environment", "torch.distributed.init_process_group("),
    ("/usr/local/lib/python3.12/dist-packages/torch/distributed/rendezvous.py", 189, "_create_c10d_store",
     "return TCPStore("),
]  # fmt: skip
_RPC_FRAMES = [
    ("v1/executor/multiproc_executor.py", 817, "worker_busy_loop", "output = func(*args, **kwargs)"),
    ("v1/worker/gpu_worker.py", 562, "execute_model", "output = self.model_runner.execute_model("),
    ("distributed/device_communicators/pynccl.py", 160, "all_reduce", "self.nccl.ncclAllReduce("),
    ("distributed/device_communicators/pynccl_wrapper.py", 366, "NCCL_CHECK",
     'raise RuntimeError(f"NCCL error: {error_str}")'),
]  # fmt: skip
FROZEN_PEER_S = 3.0  # a peer silent this long (heartbeats are 1 s apart) is frozen


class WorkerError(Exception):
    """A worker-side exception: its class, message and the traceback the worker logged."""

    def __init__(self, exc_type: str, message: str, frames: list[tuple[str, int, str, str]]) -> None:
        super().__init__(message)
        self.message = message
        self.exc_line = f"{exc_type}: {message}"
        self.traceback = logfmt.traceback_text(frames, self.exc_line)


@dataclass(frozen=True)
class WorkerSpec:
    config: ServeConfig
    knobs: Knobs
    rank: int  # global rank
    local_rank: int
    init_method: str  # tcp://addr:port
    in_process: bool = False  # uni executor: runs inside the EngineCore (no title, prefix or shm of its own)
    parent_title: str | None = None  # a forked worker shows its parent's title until it is titled itself

    @property
    def title(self) -> str:
        """vLLM's worker name: Worker + _PP<r> if pp>1 + _TP<r> if tp>1 + _EP<r> with expert parallelism."""
        cfg = self.config
        name = "Worker"
        if cfg.pipeline_parallel_size > 1:
            name += f"_PP{self.rank // cfg.tensor_parallel_size}"
        if cfg.tensor_parallel_size > 1:
            name += f"_TP{self.rank % cfg.tensor_parallel_size}"
        if cfg.enable_expert_parallel:
            name += f"_EP{self.rank}"
        return name

    @property
    def proc_name(self) -> str:
        return f"VllmWorker-{self.rank}"

    @property
    def ranked(self) -> loading.Rank:
        return loading.Rank(self.config, self.knobs, self.rank, self.local_rank)


def set_title(name: str) -> None:
    setproctitle.setproctitle(f"{os.environ.get('VLLM_PROCESS_NAME_PREFIX', 'VLLM')}::{name}")


class WorkerRuntime:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.store: StoreServer | StoreClient | None = None
        self.segment: Segment | None = None
        self.ready_at: float | None = None
        self._jit_pending = spec.knobs.jit_after is not None
        self.steps = probe.Steps(None)  # the step probe's file, once ready
        self._leaked: list[bytearray] = []
        self._closed = threading.Event()
        if spec.knobs.control_file:  # a leak asked for at run time (control.py); older commands are not ours
            control.watch_in_thread(control.ControlFile(spec.knobs.control_file), self._on_command, self._closed)

    # -- WorkerProc.__init__: device, rendezvous, model -------------------------------------------------
    def init_device(self) -> None:
        spec, cfg, d = self.spec, self.spec.config, self.spec.knobs.dialect
        logfmt.info(
            d.at("world"),
            f"world_size={cfg.world_size} rank={spec.rank} local_rank={spec.local_rank} "
            f"distributed_init_method={spec.init_method} backend={'gloo' if d.cpu_build else 'nccl'}",
        )
        self._couple()
        time.sleep(phase_seconds(spec.knobs, "distributed"))
        if not d.cpu_build:
            spec.ranked.once("nccl", "vLLM is using nccl==2.27.5")
        ep = spec.rank if cfg.enable_expert_parallel else None
        tp, pp = spec.rank % cfg.tensor_parallel_size, spec.rank // cfg.tensor_parallel_size
        spec.ranked.once("rank", d.rank_line(spec.rank, cfg.world_size, pp, tp, ep), scope="process")
        if spec.knobs.fail_free_memory:
            frames = [*_INIT_FRAMES, ("v1/worker/gpu_worker.py", 248, "init_device", "raise ValueError(")]
            raise WorkerError("ValueError", sizing.free_memory_refusal(cfg.gpu_memory_utilization, d), frames)
        if not spec.in_process:
            set_title(spec.title)
            logfmt.decorate_logs(spec.title, d)
            if spec.rank < cfg.local_world_size:
                self.segment = Segment()  # the worker's response ring, only when a reader is on this node

    def load(self) -> None:
        """``load_model`` (and, with the ``crash`` knob, the field's startup crash)."""
        knobs = self.spec.knobs
        if knobs.crash in ("double_patch", "missing_module"):
            self._crash(knobs.crash)
        loading.load_weights(self.spec.ranked)
        if not self.spec.config.enforce_eager:
            loading.compile_model(self.spec.ranked)
        if knobs.crash == "fork_shm":
            self._crash(knobs.crash)

    def _crash(self, crash: str) -> None:
        module = self.spec.knobs.missing_module
        kind, _, message = loading.crash_line(crash, module).partition(": ")
        raise WorkerError(kind, message, loading.crash_frames(crash, module))

    def _couple(self) -> None:
        spec, cfg = self.spec, self.spec.config
        if cfg.nnodes <= 1:
            return
        timeout = spec.knobs.tcpstore_timeout
        try:
            if spec.rank == 0:
                server = StoreServer(cfg.master_addr, cfg.master_port, cfg.world_size, timeout)
                server.listen()
                self.store = server
                server.wait_for_clients()
            else:
                self.store = StoreClient(cfg.master_addr, cfg.master_port, spec.rank, timeout, self._peer_step)
                self.store.join()
        except DistError as exc:
            kind, _, message = exc.exc_line.partition(": ")
            raise WorkerError(kind, message, [*_INIT_FRAMES, *_DIST_FRAMES]) from exc

    def is_peer_lost(self) -> bool:
        if isinstance(self.store, StoreServer):
            return self.store.peer_lost.is_set()
        return isinstance(self.store, StoreClient) and self.store.server_lost.is_set()

    def _check_peers(self) -> None:
        if self.is_peer_lost():
            raise WorkerError("RuntimeError", NCCL_PEER_GONE, _RPC_FRAMES)

    # -- RPCs from the executor -------------------------------------------------------------------------
    def profile(self) -> float:
        self._check_peers()
        time.sleep(phase_seconds(self.spec.knobs, "profile"))
        kv_gib = sizing.available_kv_gib(self.spec.config)
        d = self.spec.knobs.dialect
        if d.cpu_build:  # VLLM_CPU_KVCACHE_SPACE sets it (GiB), of the node's memory
            kv_gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4") or 4)
            self.spec.ranked.once("kv_set", f"Explicitly set ({kv_gib}/12.34) GiB for KV cache on node 0.")
        else:
            self.spec.ranked.once("kv_avail", d.kv_available(kv_gib))
        return kv_gib

    def warmup(self) -> None:
        self._check_peers()
        if not self.spec.config.enforce_eager and not self.spec.knobs.dialect.cpu_build:
            loading.capture_graphs(self.spec.ranked)
        loading.jit_monitor_activated(self.spec.ranked)
        self.ready_at = time.monotonic()
        spec = self.spec
        self.steps = probe.steps("worker", spec.rank, local_rank=spec.local_rank,
                                 world_size=spec.config.world_size, title=setproctitle.getproctitle(),
                                 vllm=spec.knobs.vllm_version)
        if self.spec.knobs.leak_mb_per_s > 0:
            self._start_leak(self.spec.knobs.leak_mb_per_s, self.spec.knobs.leak_max_mb)

    def execute(self, request_id: str, hang: bool = False) -> None:
        """One model step for a request: an all-reduce across ranks (see the module's docstring); ``hang``: the
        step never completes (the stall fault: a wedged rank)."""
        self.steps.begin()
        try:
            if isinstance(self.store, StoreServer):
                self.store.announce_step()
            self._wait_for_peers()
            knobs = self.spec.knobs
            due = self.ready_at is not None and time.monotonic() >= self.ready_at + (knobs.jit_after or 0.0)
            if self._jit_pending and due:
                self._jit_pending = False
                loading.jit_compile(self.spec.ranked, knobs.jit_seconds)
            if hang:
                self._closed.wait()
        finally:
            self.steps.end()

    def _peer_step(self) -> None:
        """Rank 0 began a step: a headless rank takes part in it at once."""
        self.steps.begin()
        self.steps.end()

    def _wait_for_peers(self) -> None:
        heartbeat = self.store.heartbeat if isinstance(self.store, StoreServer) else None
        marked = False
        while not self._closed.is_set():
            if self.is_peer_lost():
                if self.spec.knobs.peer_loss == "error":
                    raise WorkerError("RuntimeError", NCCL_PEER_GONE, _RPC_FRAMES)
                self._closed.wait()  # the collective never returns; the EngineCore gives up on it
                return
            if heartbeat is None or heartbeat.silent_s() <= FROZEN_PEER_S:
                return
            if not marked:
                self.steps.collective()  # waiting in the collective for a silent peer
                marked = True
            time.sleep(0.1)

    # -- faults and shutdown ----------------------------------------------------------------------------
    def _on_command(self, command: control.Command) -> None:
        if command.fault == "leak":
            self._start_leak(command.leak_mb_per_s, command.leak_max_mb)

    def _start_leak(self, mb_per_s: float, max_mb: float) -> None:
        threading.Thread(target=self._leak, args=(mb_per_s, max_mb), daemon=True, name="leak").start()

    def _leak(self, mb_per_s: float, max_mb: float) -> None:
        """Allocate and touch real memory at ``mb_per_s``, up to ``max_mb`` (the UCX leak of the field)."""
        step_s, total = 0.1, 0
        cap = int(max_mb * MIB)
        while total < cap and not self._closed.is_set():
            size = min(max(4096, int(mb_per_s * MIB * step_s)), cap - total)
            chunk = bytearray(size)
            chunk[::4096] = b"\x01" * len(range(0, size, 4096))  # write every page so it is resident
            self._leaked.append(chunk)
            total += size
            time.sleep(step_s)

    def close(self) -> None:
        self._closed.set()
        if self.segment is not None:
            self.segment.unlink()
        if self.store is not None:
            self.store.close()


# -- the worker process ------------------------------------------------------------------------------------
def worker_main(spec: WorkerSpec, conn: Connection, death_r: Connection) -> None:
    """Process target: init and load, report READY or FAILED, then serve RPCs until told to stop or orphaned."""
    d = spec.knobs.dialect
    logfmt.inherit_parent_prefix()
    if spec.parent_title and logfmt.forks():
        setproctitle.setproctitle(spec.parent_title)  # what a forked child shows until it titles itself
    if d.titles_workers_early:
        set_title("Worker")
        logfmt.decorate_logs("Worker", d)
    procs.exit_on_signals()
    procs.idle_threads(spec.knobs.idle_threads)
    if spec.knobs.ignore_sigterm_while_loading:
        procs.ignore_sigterm()
    runtime = WorkerRuntime(spec)
    procs.watch_parent(death_r, lambda: _parent_exited(runtime))
    try:
        try:
            runtime.init_device()
            runtime.load()
        except WorkerError as exc:
            logfmt.exception(d.at("worker_failed"), "WorkerProc failed to start.", exc.traceback)
            conn.send(("failed", exc.exc_line))
            return
        conn.send(("ready", os.getpid()))
        _serve_rpcs(runtime, conn)
    finally:
        runtime.close()


def _serve_rpcs(runtime: WorkerRuntime, conn: Connection) -> None:
    while True:
        try:
            kind, *params = conn.recv()
        except (EOFError, OSError):
            threading.Event().wait()  # parent gone; the death-pipe monitor decides (orphans stay)
            return
        if kind == "shutdown":
            return
        try:
            result = getattr(runtime, kind)(*params)
        except WorkerError as exc:
            logfmt.exception(runtime.spec.knobs.dialect.at("worker_exc"), "WorkerProc hit an exception.", exc.traceback)
            conn.send(("error", exc.message))
            continue
        if kind == "warmup" and runtime.spec.knobs.ignore_sigterm_while_loading:
            procs.exit_on_signals()  # loaded: SIGTERM works again
        conn.send(("ok", result))


def _parent_exited(runtime: WorkerRuntime) -> None:
    if runtime.spec.knobs.orphan_on_kill:
        return
    d = runtime.spec.knobs.dialect
    runtime.spec.ranked.once("parent_exited", d.parent_exited, scope="process")
    if d.family not in ("0.24", "0.32"):  # 0.24 leaves without a word
        logfmt.info(d.at("worker_shutdown"), "WorkerProc shutting down.")
    runtime.close()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)
