"""The head's API server process (node-rank 0, not headless): vLLM's ``run_server`` sequence.

1. the version line (0.13) or logo (0.21+) and the non-default args; bind the API port with SO_REUSEADDR and
   SO_REUSEPORT, as vLLM does (so a stale vLLM still listening there does not stop the bind: both then serve
   the port), without listening;
2. SIGTERM raises KeyboardInterrupt while loading (uncaught: the process ends by SIGINT, returncode -2);
3. start the EngineCore and wait for READY; a startup failure is ``RuntimeError: Engine core initialization
   failed ...`` and exit 1;
4. route lines, then uvicorn on the pre-bound socket: it listens right after "Application startup complete.";
5. SIGTERM/SIGINT: 0.13 cancels the server ("Shutting down FastAPI HTTP server.", then uvicorn's shutdown
   lines) and stops the engine; 0.21+ stops the engine first (0.24 logs each step as ``[shutdown] ...``). The
   watchdog stops the server within 5 s of engine death. Either way the exit is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from sparkd_standin import api, drain, faults, logfmt, procs
from sparkd_standin.args import ServeConfig
from sparkd_standin.client import EngineClient, EngineStartupError
from sparkd_standin.control import ControlFile
from sparkd_standin.dialect import LOGO
from sparkd_standin.generate import TokenSource
from sparkd_standin.knobs import Knobs, phase_seconds
from sparkd_standin.metrics import VllmMetrics
from sparkd_standin.modelconfig import create_model_config

# vLLM's watchdog looks every VLLM_WATCHDOG_TIME_S (5 s), so it stops serving 0 to 5 s after the engine died, by chance;
# the stand-in stops at a fixed point of that range, so that a test reads the dead engine's /health 503 before the
# server goes
WATCHDOG_AFTER_DEATH_S, WATCHDOG_LOOK_S = 2.5, 0.25
GRACEFUL_SHUTDOWN_S = 5.0  # bounds uvicorn's wait for hung requests (vLLM 0.13 and 0.32 wait forever)
_MAIN_FRAMES = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    ("entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
    ("entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
    (
        "entrypoints/openai/api_server.py",
        1398,
        "run_server",
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
]


def create_server_socket(host: str | None, port: int) -> socket.socket:
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host or "", port))
    except OSError:
        sock.close()
        raise
    return sock


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("terminated")


def _print_crash(frames: list[tuple[str, int, str, str]], exc_line: str) -> None:
    logfmt.print_stderr(logfmt.traceback_text(frames, exc_line))


def _log_version(config: ServeConfig, knobs: Knobs) -> None:
    d = knobs.dialect
    if not d.modern:
        logfmt.info(d.at("version"), f"vLLM API server version {d.version}")
    elif os.environ.get("VLLM_DISABLE_LOG_LOGO", "0") not in ("", "0"):
        logfmt.info(d.at("logo"), f"vLLM server version {d.version}, serving model {config.model}")
    else:
        logfmt.info(d.at("logo"), LOGO.format(version=d.version, model=config.model))
    logfmt.info(d.at("non_default"), f"non-default args: {config.non_default}")


def run_api_server(config: ServeConfig, knobs: Knobs) -> int:
    d = knobs.dialect
    logfmt.decorate_logs("APIServer", d)
    procs.idle_threads(knobs.idle_threads)
    control = ControlFile(knobs.control_file) if knobs.control_file else None  # older commands are not ours
    _log_version(config, knobs)
    try:
        sock = create_server_socket(config.host, config.port)
    except OSError as exc:
        frame = ("entrypoints/openai/api_server.py", 1318, "create_server_socket", "sock.bind(addr)")
        _print_crash([*_MAIN_FRAMES, frame], f"OSError: [Errno {exc.errno}] {exc.strerror}")
        return 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN if knobs.ignore_sigterm_while_loading else _interrupt_on_sigterm)
    if not create_model_config(config, d):
        return 1
    engine = EngineClient(config, knobs)
    try:
        info = _start_engine(config, knobs, engine)
    except EngineStartupError as exc:
        engine.shutdown()
        frame = ("v1/engine/utils.py", 960, "wait_for_engine_startup", "raise RuntimeError(")
        _print_crash([*_MAIN_FRAMES, frame], f"RuntimeError: {exc}")
        return 1
    except BaseException:  # KeyboardInterrupt from SIGTERM/SIGINT while loading: stop children, re-raise
        engine.shutdown()
        raise
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    port = sock.getsockname()[1]
    logfmt.info(d.at("tasks"), "Supported tasks: ['generate']")
    logfmt.info(d.at("starting"), d.starting(f"http://{config.host or '0.0.0.0'}:{port}"))
    logfmt.info(d.at("routes"), "Available routes are:")
    for line in api.route_lines():
        logfmt.info(d.at("route"), line)
    metrics = VllmMetrics(config, int(info["kv_tokens"]), exposed=not config.disable_log_stats)
    metrics.spec_accepting, metrics.nan_logits = knobs.spec_decode_accepts, knobs.nan_logits
    source = TokenSource(engine, metrics, knobs.tokens_per_s)
    source.answers = knobs.answers
    state = api.AppState(config, knobs, engine, metrics, source)
    try:
        asyncio.run(serve_http(state, sock, control))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        engine.shutdown()
        sys.stdout.flush()
    return 0


def _start_engine(config: ServeConfig, knobs: Knobs, engine: EngineClient) -> dict[str, Any]:
    if config.enable_chunked_prefill and not knobs.dialect.cpu_build:
        logfmt.info(
            knobs.dialect.at("chunked"),
            f"Chunked prefill is enabled with max_num_batched_tokens={config.max_num_batched_tokens}.",
        )
    time.sleep(phase_seconds(knobs, "api"))
    engine.start()
    return engine.wait_ready()


async def watchdog_loop(server: uvicorn.Server, state: api.AppState) -> None:
    """vLLM's launcher watchdog: stop serving once the engine is dead (WATCHDOG_AFTER_DEATH_S after it was seen)."""
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") == "1"
    loop = asyncio.get_running_loop()
    dead_since: float | None = None
    while True:
        await asyncio.sleep(WATCHDOG_LOOK_S)
        if state.engine.errored and not keep_alive:
            dead_since = loop.time() if dead_since is None else dead_since
            if loop.time() - dead_since >= WATCHDOG_AFTER_DEATH_S:
                server.should_exit = True


class _Server032(uvicorn.Server):
    """vLLM 0.32's server (launchers/launcher.py): uvicorn captures no signal, vLLM's own handler stops the engine
    (and drains) while HTTP serves on."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(state: api.AppState, sock: socket.socket, control: ControlFile | None = None) -> None:
    cfg = state.config
    config = uvicorn.Config(
        api.build_app(state),
        log_level=cfg.uvicorn_log_level,
        access_log=not cfg.disable_uvicorn_access_log,
        timeout_keep_alive=5,
        # 0.32 waits for every connection to close, however long (tests/data/vllm-drain-032.json, abort)
        timeout_graceful_shutdown=None if state.knobs.dialect.family == "0.32" else int(GRACEFUL_SHUTDOWN_S),
        lifespan="on",
    )
    server = (_Server032 if state.knobs.dialect.family == "0.32" else uvicorn.Server)(config)
    if not cfg.disable_log_stats:
        state.background.append(api.log_stats_forever)
    state.background.append(lambda st: faults.run_faults(st, server))
    if control is not None:
        state.background.append(lambda st: faults.follow_control(control, st, server))
    loop = asyncio.get_running_loop()
    server_task = loop.create_task(server.serve(sockets=[sock]))
    watchdog_task = loop.create_task(watchdog_loop(server, state))

    def signal_handler() -> None:
        if state.knobs.dialect.family == "0.32":  # the engine stops (and drains) first, HTTP serving meanwhile
            if not state.stopping:
                state.stopping = True
                stopping.append(loop.create_task(_stop_engine_then_http(state, server_task, watchdog_task)))
            return
        server_task.cancel()
        watchdog_task.cancel()

    stopping: list[asyncio.Task[None]] = []

    loop.add_signal_handler(signal.SIGINT, signal_handler)
    loop.add_signal_handler(signal.SIGTERM, signal_handler)
    try:
        await server_task
    except asyncio.CancelledError:
        await _shut_down(state, server)
    finally:
        watchdog_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog_task


async def _stop_engine_then_http(state: api.AppState, server_task: asyncio.Task[None],
                                 watchdog_task: asyncio.Task[None]) -> None:
    """0.32 (standin/sparkd_standin/drain.py): the engine client stops with the launch's drain while HTTP serves on
    (new requests refused), then the HTTP server is told to shut down."""
    d, timeout = state.knobs.dialect, state.config.shutdown_timeout
    logfmt.info(d.at("shutdown_triggered"), "[shutdown] API server: shutdown triggered")
    logfmt.info(d.at("shutdown_engine"),
                f"[shutdown] API server: stopping engine client mode={drain.mode_of(timeout)} timeout={timeout}s")
    await asyncio.get_running_loop().run_in_executor(
        None, state.engine.drain_stop, timeout, lambda: state.source.in_flight)
    logfmt.info(d.at("shutdown_engine_done"), "[shutdown] API server: engine client stopped")
    logfmt.info(d.at("shutdown_signalling"), "[shutdown] API server: signalling HTTP server shutdown")
    server_task.cancel()
    watchdog_task.cancel()


async def _shut_down(state: api.AppState, server: uvicorn.Server) -> None:
    """0.13 stops the HTTP server, then (in run_api_server) the engine; 0.21+ the engine first (0.32: done by
    _stop_engine_then_http before the HTTP server was cancelled)."""
    d = state.knobs.dialect
    if state.stopping:
        logfmt.info(d.at("shutdown_http"), "[shutdown] API server: shutting down FastAPI HTTP server")
        await server.shutdown()
        return
    if d.shutdown_steps:
        logfmt.info(d.at("shutdown_triggered"), "[shutdown] API server: shutdown triggered")
        logfmt.info(d.at("shutdown_engine"), "[shutdown] API server: stopping engine client mode=abort timeout=0s")
    if d.modern:
        await asyncio.get_running_loop().run_in_executor(None, state.engine.shutdown)
    if d.shutdown_steps:
        logfmt.info(d.at("shutdown_engine_done"), "[shutdown] API server: engine client stopped")
        logfmt.info(d.at("shutdown_signalling"), "[shutdown] API server: signalling HTTP server shutdown")
        logfmt.info(d.at("shutdown_http"), "[shutdown] API server: shutting down FastAPI HTTP server")
    else:
        logfmt.info(d.at("shutdown_http"), "Shutting down FastAPI HTTP server.")
    await server.shutdown()
