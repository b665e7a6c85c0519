"""One vLLM worker (rank): distributed init, the free-memory check, weight loading, KV profiling, CUDA-graph
capture, and the per-request "collective" that fails once a remote rank is gone.

``WorkerRuntime`` does the work; ``worker_main`` runs it in its own process (multiproc executor) and serves the
executor's RPCs over a pipe. With one rank on one node the EngineCore runs the runtime itself (uni executor).
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

from sparkd.standin import logfmt, procs, sizing
from sparkd.standin.args import ServeConfig
from sparkd.standin.knobs import Knobs, phase_seconds
from sparkd.standin.rendezvous import DistError, StoreClient, StoreServer
from sparkd.standin.shm import Segment

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
    (
        "/usr/local/lib/python3.12/dist-packages/torch/distributed/rendezvous.py",
        189,
        "_create_c10d_store",
        "return TCPStore(",
    ),
]
_RPC_FRAMES = [
    ("v1/executor/multiproc_executor.py", 817, "worker_busy_loop", "output = func(*args, **kwargs)"),
    ("v1/worker/gpu_worker.py", 562, "execute_model", "output = self.model_runner.execute_model("),
    ("distributed/device_communicators/pynccl.py", 160, "all_reduce", "self.nccl.ncclAllReduce("),
    (
        "distributed/device_communicators/pynccl_wrapper.py",
        366,
        "NCCL_CHECK",
        'raise RuntimeError(f"NCCL error: {error_str}")',
    ),
]


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


class WorkerRuntime:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.store: StoreServer | StoreClient | None = None
        self.segment: Segment | None = None
        self._leaked: list[bytearray] = []
        self._closed = threading.Event()

    # -- distributed init -------------------------------------------------------------------------------
    def init_device(self) -> None:
        spec, cfg = self.spec, self.spec.config
        logfmt.info(
            "parallel_state.py:1204",
            f"world_size={cfg.world_size} rank={spec.rank} local_rank={spec.local_rank} "
            f"distributed_init_method={spec.init_method} backend=nccl",
        )
        self._couple()
        time.sleep(phase_seconds(spec.knobs, "distributed"))
        logfmt.info("pynccl.py:112", "vLLM is using nccl==2.27.5")
        ep = str(spec.rank) if cfg.enable_expert_parallel else "N/A"
        logfmt.info(
            "parallel_state.py:1412",
            f"rank {spec.rank} in world size {cfg.world_size} is assigned as DP rank 0, "
            f"PP rank {spec.rank // cfg.tensor_parallel_size}, PCP rank 0, "
            f"TP rank {spec.rank % cfg.tensor_parallel_size}, EP rank {ep}",
        )
        if spec.knobs.fail_free_memory:
            frames = [*_INIT_FRAMES, ("v1/worker/gpu_worker.py", 248, "init_device", "raise ValueError(")]
            raise WorkerError("ValueError", sizing.free_memory_refusal(cfg.gpu_memory_utilization), frames)
        if not spec.in_process:
            setproctitle.setproctitle(f"{os.environ.get('VLLM_PROCESS_NAME_PREFIX', 'VLLM')}::{spec.title}")
            logfmt.decorate_logs(spec.title)
            if spec.rank < cfg.local_world_size:
                self.segment = Segment()  # the worker's response ring, only when a reader is on this node

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
                self.store = StoreClient(cfg.master_addr, cfg.master_port, spec.rank, timeout)
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

    # -- load phases (RPCs from the executor) -----------------------------------------------------------
    def load(self) -> None:
        self._check_peers()
        spec, cfg, knobs = self.spec, self.spec.config, self.spec.knobs
        started = time.monotonic()
        if spec.rank == 0:
            logfmt.info("gpu_model_runner.py:3563", f"Starting to load model {cfg.model}...")
        logfmt.info(
            "cuda.py:352",
            "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', "
            "'TRITON_ATTN', 'FLEX_ATTENTION']",
        )
        self._load_shards(started)
        logfmt.info("default_loader.py:309", f"Loading weights took {time.monotonic() - started:.2f} seconds")
        if cfg.speculative_config:
            logfmt.info("gpu_model_runner.py:3597", "Loading drafter model...")
        time.sleep(phase_seconds(knobs, "model"))
        logfmt.info(
            "gpu_model_runner.py:3660",
            f"Model loading took {sizing.weights_gib(cfg):.4f} GiB memory and {time.monotonic() - started:.6f} seconds",
        )
        if not cfg.enforce_eager:
            self._compile()

    def _load_shards(self, started: float) -> None:
        shards = max(1, self.spec.knobs.shards)
        show = self.spec.rank == 0
        if show:
            logfmt.progress(_shard_line(0, shards, 0.0))
        for done in range(1, shards + 1):
            time.sleep(phase_seconds(self.spec.knobs, "weights") / shards)
            if show:
                logfmt.progress(_shard_line(done, shards, time.monotonic() - started))

    def _compile(self) -> None:
        spec = self.spec
        compile_s = phase_seconds(spec.knobs, "compile")
        logfmt.info(
            "backends.py:644",
            f"Using cache directory: /root/.cache/vllm/torch_compile_cache/6f1e0c2a9b/rank_{spec.rank}_0/backbone "
            "for vLLM's torch.compile",
        )
        time.sleep(compile_s * 0.3)
        logfmt.info("backends.py:704", f"Dynamo bytecode transform time: {compile_s * 0.3:.2f} s")
        time.sleep(compile_s * 0.7)
        logfmt.info(
            "backends.py:279",
            f"Compiling a graph for compile range (1, {spec.config.max_num_batched_tokens}) takes "
            f"{compile_s * 0.7:.2f} s",
        )
        logfmt.info("monitor.py:35", f"torch.compile takes {compile_s:.2f} s in total")

    def profile(self) -> float:
        self._check_peers()
        time.sleep(phase_seconds(self.spec.knobs, "profile"))
        kv_gib = sizing.available_kv_gib(self.spec.config)
        logfmt.info("gpu_worker.py:376", f"Available KV cache memory: {kv_gib:.2f} GiB")
        return kv_gib

    def warmup(self) -> None:
        self._check_peers()
        spec = self.spec
        if not spec.config.enforce_eager:
            started = time.monotonic()
            seconds = phase_seconds(spec.knobs, "graphs")
            for label, count, share in (("mixed prefill-decode, PIECEWISE", 67, 0.6), ("decode, FULL", 35, 0.4)):
                self._capture(label, count, seconds * share)
            if spec.local_rank == 0:
                logfmt.info(
                    "gpu_model_runner.py:4588",
                    f"Graph capturing finished in {time.monotonic() - started:.0f} secs, "
                    f"took {sizing.CUDA_GRAPH_GIB:.2f} GiB",
                )
        if spec.knobs.leak_mb_per_s > 0:
            threading.Thread(target=self._leak, daemon=True, name="leak").start()

    def _capture(self, label: str, count: int, seconds: float) -> None:
        desc = f"Capturing CUDA graphs ({label})"
        show = self.spec.rank == 0
        if show:
            logfmt.progress(f"{desc}:   0%|          | 0/{count} [00:00<?, ?it/s]")
        time.sleep(seconds)
        if show:
            rate = count / max(seconds, 1e-3)
            logfmt.progress(
                f"{desc}: 100%|██████████| {count}/{count} [{logfmt.format_elapsed(seconds)}<00:00, {rate:.2f}it/s]"
            )

    def execute(self, request_id: str) -> None:
        """One model step for a request: an all-reduce across ranks, which fails once a peer is gone and
        blocks while a peer is frozen (connected but silent), as an NCCL collective does."""
        self._check_peers()
        heartbeat = self.store.heartbeat if isinstance(self.store, StoreServer) else None
        while heartbeat is not None and heartbeat.silent_s() > FROZEN_PEER_S and not self._closed.is_set():
            time.sleep(0.1)
            self._check_peers()

    # -- faults and shutdown ----------------------------------------------------------------------------
    def _leak(self) -> None:
        """Allocate and touch real memory at leak_mb_per_s, up to leak_max_mb (the UCX leak of the field)."""
        knobs, step_s, total = self.spec.knobs, 0.1, 0
        cap = int(knobs.leak_max_mb * MIB)
        while total < cap and not self._closed.is_set():
            size = min(max(4096, int(knobs.leak_mb_per_s * MIB * step_s)), cap - total)
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


def _shard_line(done: int, total: int, elapsed: float) -> str:
    percent = 100 * done / total
    if done == 0:
        timing = "00:00<?, ?it/s"
    else:
        per_shard = elapsed / done
        remaining = logfmt.format_elapsed(per_shard * (total - done))
        rate = f"{per_shard:5.2f}s/it" if per_shard > 1 else f"{1 / max(per_shard, 1e-6):5.2f}it/s"
        timing = f"{logfmt.format_elapsed(elapsed)}<{remaining}, {rate}"
    return f"Loading safetensors checkpoint shards: {percent:3.0f}% Completed | {done}/{total} [{timing}]"


# -- the worker process ------------------------------------------------------------------------------------
def worker_main(spec: WorkerSpec, conn: Connection, death_r: Connection) -> None:
    """Process target: init, report READY or FAILED, then serve RPCs until told to stop or orphaned."""
    procs.exit_on_signals()
    if spec.knobs.ignore_sigterm_while_loading:
        procs.ignore_sigterm()
    runtime = WorkerRuntime(spec)
    procs.watch_parent(death_r, lambda: _parent_exited(runtime))
    try:
        try:
            runtime.init_device()
        except WorkerError as exc:
            logfmt.exception("multiproc_executor.py:751", "WorkerProc failed to start.", exc.traceback)
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
            logfmt.exception("multiproc_executor.py:822", "WorkerProc hit an exception.", exc.traceback)
            conn.send(("error", exc.message))
            continue
        if kind == "warmup" and runtime.spec.knobs.ignore_sigterm_while_loading:
            procs.exit_on_signals()  # loaded: SIGTERM works again
        conn.send(("ok", result))


def _parent_exited(runtime: WorkerRuntime) -> None:
    if runtime.spec.knobs.orphan_on_kill:
        return
    logfmt.info("multiproc_executor.py:558", "Parent process exited, terminating worker")
    logfmt.info("multiproc_executor.py:599", "WorkerProc shutting down.")
    runtime.close()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)
