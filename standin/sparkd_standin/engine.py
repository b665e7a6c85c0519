"""The EngineCore process (``VLLM::EngineCore``; prefix ``EngineCore_DP0`` in 0.13, ``EngineCore`` in 0.21+).

It creates its broadcast ring in /dev/shm and the executor's lock, starts the workers (which load the model),
drives the profile (→ KV cache size) and the warmup, reports READY to the API server and then runs one step
per request, one at a time. A failing or dying worker, or a step the workers do not finish within the RPC
timeout (``executor.RpcWait``), makes the engine fatal: it logs vLLM's lines, tells the API server it is dead
and exits 1. The ``stall`` fault makes every step hang from then on, as a wedged rank does. Like vLLM's
EngineCore it has no parent-death detection of its own; for test hygiene it still exits when the API server
dies unless ``orphan_on_kill`` is set.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import setproctitle

from sparkd_standin import config032, drain, logfmt, probe, procs, sizing
from sparkd_standin.args import ServeConfig
from sparkd_standin.executor import (
    MultiprocExecutor,
    RpcFailed,
    RpcTimeout,
    RpcWait,
    WorkerDied,
    WorkerInitFailed,
    make_executor,
)
from sparkd_standin.knobs import Knobs, phase_seconds
from sparkd_standin.shm import Segment
from sparkd_standin.worker import WorkerError

RPC_TIMED_OUT = "TimeoutError: RPC call to sample_tokens timed out."
_CORE_FRAMES = [
    ("v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    ("v1/engine/core.py", 637, "__init__", "super().__init__("),
    ("v1/engine/core.py", 102, "__init__", "self.model_executor = executor_class(vllm_config)"),
    ("v1/executor/abstract.py", 101, "__init__", "self._init_executor()"),
]
_BUSY_FRAMES = [
    ("v1/engine/core.py", 880, "run_engine_core", "engine_core.run_busy_loop()"),
    ("v1/engine/core.py", 907, "run_busy_loop", "self._process_engine_step()"),
    ("v1/engine/core.py", 932, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
]
INIT_FAILED = (
    "Exception: WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause."
)
NO_KV_MEMORY = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)


class NoKvCacheMemory(Exception):
    """The profile left no memory for the KV cache."""


def worker_failed(message: str) -> str:
    return f"RuntimeError: Worker failed with error '{message}', please check the stack trace above for the root cause"


class EngineCore:
    def __init__(self, config: ServeConfig, knobs: Knobs, conn: Connection) -> None:
        self.config = config
        self.knobs = knobs
        self.conn = conn
        self.segment = Segment()  # the executor's RPC broadcast ring
        self.lock = procs.lock_context().Lock()  # vLLM's shared_worker_lock (/dev/shm/sem.mp-* under spawn)
        self.executor = make_executor(config, knobs, node_rank=0, parent_title=engine_title())
        self.kv_tokens = 0
        self.stalled = False
        self.steps = probe.Steps(None)  # the step probe's file, once serving
        self.told: tuple[Any, ...] | None = None  # the API server's drain message, once sent
        self._close_lock = threading.Lock()
        self._closed = False

    def start(self) -> bool:
        """Load everything; True once READY was sent, False after a startup failure was reported."""
        d = self.knobs.dialect
        started = time.monotonic()
        logfmt.info(d.at("init_engine"), self._config_line())
        if "OMP_NUM_THREADS" not in os.environ and d.cpu_build:
            logfmt.info(d.at("reduce_threads"), f"Reducing Torch threads from {os.cpu_count() or 1} to 1 for serving. "
                        "Set OMP_NUM_THREADS in the external environment to override.")
        elif "OMP_NUM_THREADS" not in os.environ and isinstance(self.executor, MultiprocExecutor):
            logfmt.warning(
                d.at("reduce_threads"),
                f"Reducing Torch parallelism from {os.cpu_count() or 1} threads to 1 to avoid unnecessary CPU "
                "contention. Set OMP_NUM_THREADS in the external environment to tune this value as needed.",
            )
        time.sleep(phase_seconds(self.knobs, "engine"))
        try:
            self._load()
        except (WorkerInitFailed, WorkerDied):
            return self._startup_failed(_CORE_FRAMES, INIT_FAILED)
        except RpcFailed as exc:
            return self._startup_failed(_CORE_FRAMES, worker_failed(exc.message))
        except WorkerError as exc:  # uni executor: the rank's own exception
            return self._startup_failed(_CORE_FRAMES, exc.exc_line)
        except NoKvCacheMemory:
            return self._startup_failed(_CORE_FRAMES, NO_KV_MEMORY)
        time.sleep(phase_seconds(self.knobs, "finish"))
        compile_s = 0.0 if self.config.enforce_eager else phase_seconds(self.knobs, "compile")
        where, text = d.init_took(time.monotonic() - started, compile_s)
        logfmt.info(where, text)
        self.conn.send(("ready", self._ready_info()))
        return True

    def _load(self) -> None:
        d = self.knobs.dialect
        self.executor.start()
        self.executor.wait_ready()
        kv_gib = min(self.executor.collective("profile"))
        if kv_gib <= 0:
            raise NoKvCacheMemory
        self.kv_tokens = sizing.kv_cache_tokens(self.config, kv_gib)
        max_len = self.config.resolved_max_model_len
        concurrency = (f"Maximum concurrency for {max_len:,} tokens per request: "
                       f"{sizing.max_concurrency(self.kv_tokens, max_len):.2f}x")
        if d.cpu_build:  # one line since 0.28
            logfmt.info(d.at("kv_size"), f"{d.device} KV cache size: {self.kv_tokens:,} tokens, {concurrency}")
        else:
            logfmt.info(d.at("kv_size"), f"{d.device} KV cache size: {self.kv_tokens:,} tokens")
            logfmt.info(d.at("kv_conc"), concurrency)
        self.executor.collective("warmup")

    def _ready_info(self) -> dict[str, object]:
        return {"engine_pid": os.getpid(), "worker_pids": self.executor.pids(), "kv_tokens": self.kv_tokens}

    def _config_line(self) -> str:
        cfg = self.config
        if self.knobs.dialect.cpu_build:
            return config032.config_line(self.knobs.vllm_version, cfg)
        compilation = {"level": None, "mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE", **cfg.compilation_config}
        return (
            f"Initializing a V1 LLM engine (v{self.knobs.vllm_version}) with config: model='{cfg.model}', "
            f"speculative_config={cfg.speculative_config}, tokenizer='{cfg.tokenizer or cfg.model}', "
            f"skip_tokenizer_init=False, tokenizer_mode={cfg.tokenizer_mode}, revision=None, "
            f"tokenizer_revision=None, trust_remote_code={cfg.trust_remote_code}, dtype=torch.bfloat16, "
            f"max_seq_len={cfg.resolved_max_model_len}, download_dir=None, load_format={cfg.load_format}, "
            f"tensor_parallel_size={cfg.tensor_parallel_size}, pipeline_parallel_size={cfg.pipeline_parallel_size}, "
            f"data_parallel_size=1, disable_custom_all_reduce=False, quantization={cfg.quantization}, "
            f"enforce_eager={cfg.enforce_eager}, kv_cache_dtype={cfg.kv_cache_dtype}, device_config=cuda, "
            f"seed={cfg.seed}, served_model_name={cfg.served_model_names[0]}, "
            f"enable_prefix_caching={cfg.enable_prefix_caching}, "
            f"enable_chunked_prefill={cfg.enable_chunked_prefill}, pooler_config=None, "
            f"compilation_config={compilation}"
        )

    def _startup_failed(self, frames: list[tuple[str, int, str, str]], exc_line: str) -> bool:
        text = logfmt.traceback_text(frames, exc_line)
        logfmt.exception(self.knobs.dialect.at("core_failed"), "EngineCore failed to start.", text)
        logfmt.print_stderr(f"Process {self.knobs.dialect.engine_proc}:\n{text}")
        with contextlib.suppress(OSError):
            self.conn.send(("failed",))
        return False

    # -- serving --------------------------------------------------------------------------------------------
    def busy_loop(self) -> None:
        watched: list[object] = [self.conn, *self.executor.sentinels()]
        try:
            while True:
                for ready in wait(watched):  # type: ignore[arg-type]
                    if ready is self.conn:
                        if not self._handle_request():
                            watched.remove(self.conn)  # API server gone: orphaned (or about to exit)
                    else:
                        name = self.executor.name_of(ready)  # type: ignore[arg-type]
                        self._worker_died(name)
        except drain.StopRequested:  # 0.32: its SIGTERM handler asks the busy loop to shut down (and drain)
            drain.engine_shut_down(self.knobs.dialect, self.conn, self.config.shutdown_timeout, self.told,
                                   self._answer)

    def _handle_request(self) -> bool:
        with procs.signals_held():  # the drain's word, written just ahead of the SIGTERM, is never lost to it
            try:
                kind, *params = self.conn.recv()
            except (EOFError, OSError):
                return False
            if kind == "shutdown":
                raise SystemExit(0)
            if kind == "stall":
                self.stalled = True
                return True
            if kind in ("drain", "drained"):  # the API server's word ahead of its SIGTERM
                self.told = (kind, *params)
                return True
        self._answer(params[0])
        return True

    def _answer(self, request_id: str) -> None:
        try:
            self._step(request_id)
        except WorkerDied as exc:
            self._worker_died(exc.name)
        except RpcFailed as exc:
            self._fatal(worker_failed(exc.message))
        except RpcTimeout:
            self._fatal(RPC_TIMED_OUT)
        with contextlib.suppress(OSError):
            self.conn.send(("result", request_id))

    def _step(self, request_id: str) -> None:
        """One engine step: the workers' RPC, waited on as vLLM waits (none for the uni executor). Stalled, the
        workers never answer it: the engine waits until one dies or the RPC times out (the uni executor's rank
        hangs the engine for good), as vLLM's does."""
        self.steps.begin(-1)
        try:
            self.executor.collective("execute", request_id, self.stalled, wait_for=self._rpc_wait())
        finally:
            self.steps.end(0)

    def _rpc_wait(self) -> RpcWait | None:
        return RpcWait(self.knobs, self._no_free_block) if isinstance(self.executor, MultiprocExecutor) else None

    def _no_free_block(self, shown_interval: int) -> None:
        logfmt.info(
            self.knobs.dialect.at("shm_wait"),
            f"No available shared memory broadcast block found in {shown_interval} seconds. This typically "
            "happens when some processes are hanging or doing some time-consuming work (e.g. compilation, "
            "weight/kv cache quantization).",
        )

    def _worker_died(self, name: str) -> None:
        logfmt.error(
            self.knobs.dialect.at("worker_died"), f"Worker proc {name} died unexpectedly, shutting down executor."
        )
        self.executor.shutdown()
        self._fatal("RuntimeError: Executor failed.")

    def _fatal(self, exc_line: str) -> None:
        text = logfmt.traceback_text(_BUSY_FRAMES, exc_line)
        logfmt.exception(self.knobs.dialect.at("core_fatal"), "EngineCore encountered a fatal error.", text)
        with contextlib.suppress(OSError):
            self.conn.send(("dead",))
        logfmt.print_stderr(f"Process {self.knobs.dialect.engine_proc}:\n{text}")
        raise SystemExit(1)

    def on_parent_exit(self) -> None:
        if self.knobs.orphan_on_kill:
            return
        self.close()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(0)

    def close(self) -> None:
        with self._close_lock:  # held throughout: a second caller waits until the first is done
            if self._closed:
                return
            self._closed = True
            self.executor.shutdown()
            self.segment.unlink()


def engine_title() -> str:
    return f"{os.environ.get('VLLM_PROCESS_NAME_PREFIX', 'VLLM')}::EngineCore"


def _signal_line(knobs: Knobs) -> Callable[[str], None] | None:
    """0.32's engine core logs the signal that stops it."""
    d = knobs.dialect
    if d.family != "0.32":
        return None
    return lambda name: logfmt.info(d.at("engine_signal"), f"[shutdown] EngineCore: trigger received signal={name}")


def engine_core_main(config: ServeConfig, knobs: Knobs, conn: Connection, death_r: Connection) -> None:
    """Process target of the EngineCore."""
    logfmt.inherit_parent_prefix()
    setproctitle.setproctitle(engine_title())
    logfmt.decorate_logs(knobs.dialect.engine_proc, knobs.dialect)
    procs.exit_on_signals()
    procs.idle_threads(knobs.idle_threads)
    if knobs.ignore_sigterm_while_loading:
        procs.ignore_sigterm()
    core = EngineCore(config, knobs, conn)
    procs.watch_parent(death_r, core.on_parent_exit)
    try:
        if not core.start():
            raise SystemExit(1)
        procs.exit_on_signals(_signal_line(knobs), drain.StopRequested if knobs.dialect.family == "0.32" else None)
        core.steps = probe.steps("engine", 0, world_size=config.world_size, title=engine_title(),
                                 vllm=knobs.vllm_version)
        core.busy_loop()
    finally:
        core.close()
