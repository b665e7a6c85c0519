"""A headless node (``--headless --node-rank N``): vLLM's ``run_headless``.

The main process keeps its argv title and is not decorated. It logs the "Launching vLLM ... headless
multiproc executor" line, starts its local worker(s) (``VLLM::Worker_TP<rank>``), which couple with rank 0
through the master port, drives their load phases, then watches them: a dying worker ends the node with
"Worker proc VllmWorker-N died unexpectedly, shutting down executor." and exit 0. SIGTERM exits 0 after stopping
the workers, without a word (vLLM logs "Shutting down." only on its data-parallel headless path). When the
head goes away nothing here exits: the worker prints torch's TCPStore warnings forever.

Unlike vLLM, this node drives its own profile and warmup: the ranks couple at the join and at each step, not in
those phases, so the head can be ready while this node still loads or captures graphs (in vLLM the head's
EngineCore waits for every rank's). A test that needs the pair whole waits for this node's "Graph capturing
finished".
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import wait

from sparkd_standin import logfmt, procs
from sparkd_standin.args import ServeConfig
from sparkd_standin.engine import INIT_FAILED, worker_failed
from sparkd_standin.executor import MultiprocExecutor, RpcFailed, WorkerDied, WorkerInitFailed, local_specs
from sparkd_standin.executor import init_method as make_init_method
from sparkd_standin.knobs import Knobs
from sparkd_standin.modelconfig import create_model_config

_HEADLESS_FRAMES = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    ("entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
    ("entrypoints/cli/serve.py", 58, "cmd", "run_headless(args)"),
    (
        "entrypoints/cli/serve.py",
        124,
        "run_headless",
        "executor = MultiprocExecutor(vllm_config, monitor_workers=False)",
    ),
]


def run_headless(config: ServeConfig, knobs: Knobs) -> int:
    procs.exit_on_signals()
    procs.idle_threads(knobs.idle_threads)
    if knobs.ignore_sigterm_while_loading:
        procs.ignore_sigterm()
    d = knobs.dialect
    if not create_model_config(config, d):
        return 1
    logfmt.info(
        d.at("headless"),
        f"Launching vLLM (v{knobs.vllm_version}) headless multiproc executor, with head node address "
        f"{config.master_addr}:{config.master_port} for torch.distributed process group.",
    )
    lock = procs.lock_context().Lock()  # the executor's shared_worker_lock (/dev/shm/sem.mp-* under spawn)
    executor = MultiprocExecutor(local_specs(config, knobs, config.node_rank, make_init_method(config)))
    try:
        failure = _load(executor)
        if failure is not None:
            logfmt.print_stderr(logfmt.traceback_text(_HEADLESS_FRAMES, failure))
            return 1
        procs.exit_on_signals()
        try:
            _warm_up(executor)
        except WorkerDied as exc:
            return _worker_died(exc.name, knobs)
        except RpcFailed as exc:
            logfmt.print_stderr(logfmt.traceback_text(_HEADLESS_FRAMES, worker_failed(exc.message)))
            return 1
        return _watch(executor, knobs)
    except SystemExit:
        return 0
    finally:
        executor.shutdown()
        del lock


def _load(executor: MultiprocExecutor) -> str | None:
    """Start the local ranks and wait for their READY (the end of vLLM's ``MultiprocExecutor`` init); the
    traceback's last line on failure."""
    try:
        executor.start()
        executor.wait_ready()
    except (WorkerInitFailed, WorkerDied):
        return INIT_FAILED
    return None


def _warm_up(executor: MultiprocExecutor) -> None:
    """The profile and warmup phases, which in vLLM rank 0's EngineCore drives after this node's init ended: a
    worker that dies in them is the monitor's "died unexpectedly" (WorkerDied), not an init failure."""
    for phase in ("profile", "warmup"):
        executor.collective(phase)


def _worker_died(name: str, knobs: Knobs) -> int:
    logfmt.error(knobs.dialect.at("worker_died"), f"Worker proc {name} died unexpectedly, shutting down executor.")
    return 0


def _watch(executor: MultiprocExecutor, knobs: Knobs) -> int:
    """Block until a local worker dies (exit 0), or until the die fault fires."""
    die_at = None if knobs.die_after is None else time.monotonic() + knobs.die_after
    while True:
        timeout = None if die_at is None else max(0.0, die_at - time.monotonic())
        died = wait(executor.sentinels(), timeout)
        if died:
            return _worker_died(executor.name_of(died[0]), knobs)  # type: ignore[arg-type]
        if die_at is not None:
            die_at = None
            code = _die(executor, knobs)
            if code is not None:
                return code


def _die(executor: MultiprocExecutor, knobs: Knobs) -> int | None:
    if knobs.die_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if knobs.die_mode == "exit":
        return knobs.die_exit_code
    for pid in executor.pids()[:1]:  # worker / engine: the local worker dies
        os.kill(pid, signal.SIGKILL)
    return None
