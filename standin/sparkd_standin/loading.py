"""What a worker prints while it loads: weights, torch.compile, the KV-cache profile, CUDA-graph capture; the
field's startup crashes (``crash`` knob); and the JIT-compile lines of a kernel built while serving.

Scopes follow vLLM's ``info_once``: ``global`` lines come from global rank 0 only, ``local`` ones from each
node's first rank, and ``process`` ones from every process in 0.13 but only from each node's first rank in
0.21+ (whose ``info_once`` defaults to ``local``). tqdm bars come from global rank 0.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from sparkd_standin import logfmt, sizing
from sparkd_standin.args import ServeConfig
from sparkd_standin.knobs import Knobs, phase_seconds

_LOAD_FRAMES = [
    ("v1/executor/multiproc_executor.py", 722, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
    ("v1/executor/multiproc_executor.py", 567, "__init__", "self.worker.load_model()"),
    ("v1/worker/gpu_worker.py", 273, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
    ("v1/worker/gpu_model_runner.py", 3580, "load_model", "self.model = model_loader.load_model("),
    ("model_executor/model_loader/base_loader.py", 56, "load_model", "model = initialize_model("),
]
# (exception line, the frames below _LOAD_FRAMES) of each crash the ``crash`` knob replays.
CRASH_FRAMES = {
    "fork_shm": [  # after load_model: WorkerProc.__init__ attaches its message queues last
        ("v1/executor/multiproc_executor.py", 677, "__init__",
         "self._init_message_queues(input_shm_handle, vllm_config)"),
        ("v1/executor/multiproc_executor.py", 612, "_init_message_queues",
         "self.rpc_broadcast_mq = MessageQueue.create_from_handle("),
        ("distributed/device_communicators/shm_broadcast.py", 443, "create_from_handle",
         "self.buffer = ShmRingBuffer(*handle.buffer_handle)"),
        ("distributed/device_communicators/shm_broadcast.py", 279, "__init__",
         "with self.shared_memory.buf[self.metadata_offset :] as metadata_buffer:"),
    ],
    "double_patch": [
        ("model_executor/model_loader/base_loader.py", 63, "load_model", "process_weights_after_loading(model, "
         "model_config, target_device)"),
        ("model_executor/layers/quantization/mxfp4.py", 412, "process_weights_after_loading",
         "del w13, w2, w13_scale, w2_scale"),
    ],
    "missing_module": [
        ("model_executor/models/deepseek_v4.py", 31, "<module>", "from vllm.utils.deep_gemm import fp8_mqa_logits"),
        ("utils/deep_gemm.py", 24, "<module>", "import {module}"),
    ],
}  # fmt: skip


def crash_line(crash: str, module: str) -> str:
    return {
        "fork_shm": "AttributeError: 'ShmRingBuffer' object has no attribute 'shared_memory'",
        # Python 3.12's words (vLLM's images); Python <= 3.10 said "local variable 'w13' referenced before assignment"
        "double_patch": "UnboundLocalError: cannot access local variable 'w13' where it is not associated with a value",
        "missing_module": f"ModuleNotFoundError: No module named '{module}'",
    }[crash]


def crash_frames(crash: str, module: str) -> list[tuple[str, int, str, str]]:
    frames = CRASH_FRAMES[crash]
    base = _LOAD_FRAMES[:1] if crash == "fork_shm" else _LOAD_FRAMES
    return [*base, *((path, line, func, code.format(module=module)) for path, line, func, code in frames)]


@dataclass(frozen=True)
class Rank:
    config: ServeConfig
    knobs: Knobs
    rank: int  # global rank
    local_rank: int

    def once(self, key: str, message: str, scope: str = "local") -> None:
        """vLLM's ``info_once`` with ``scope`` (``global``, ``local`` or ``process``, the default's meaning)."""
        d = self.knobs.dialect
        if scope == "process" and not d.once_everywhere:
            scope = "local"
        if (scope == "global" and self.rank != 0) or (scope == "local" and self.local_rank != 0):
            return
        logfmt.info(d.at(key), message)


def load_weights(rank: Rank) -> None:
    cfg, knobs, d = rank.config, rank.knobs, rank.knobs.dialect
    started = time.monotonic()
    rank.once("start_load", f"Starting to load model {cfg.model}...", scope="global")
    if not d.cpu_build:
        rank.once(
            "attn",
            "Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', "
            "'TRITON_ATTN', 'FLEX_ATTENTION']",
        )
    _load_shards(rank, started)
    rank.once("weights_took", f"Loading weights took {time.monotonic() - started:.2f} seconds")
    if d.cpu_build:  # the CPU model runner logs no "Model loading took"
        return
    if cfg.speculative_config:
        rank.once("drafter", "Loading drafter model...", scope="process")
    time.sleep(phase_seconds(knobs, "model"))
    rank.once("model_took", d.model_took(sizing.weights_gib(cfg), time.monotonic() - started))


def _load_shards(rank: Rank, started: float) -> None:
    shards = max(1, rank.knobs.shards)
    show = rank.rank == 0
    if show:
        logfmt.progress(_shard_line(0, shards, 0.0))
    for done in range(1, shards + 1):
        time.sleep(phase_seconds(rank.knobs, "weights") / shards)
        if show:
            logfmt.progress(_shard_line(done, shards, time.monotonic() - started))


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


def compile_model(rank: Rank) -> None:
    compile_s = phase_seconds(rank.knobs, "compile")
    if rank.knobs.dialect.cpu_build:  # the CPU model runner warms the model up for its compile
        rank.once("warmup", "Warming up model for the compilation...")
        time.sleep(compile_s)
        rank.once("warmup_took", f"[backbone] Initial profiling/warmup run took {compile_s * 0.01:.2f} s")
        rank.once("warmup_done", "Warming up done.")
        return
    rank.once(
        "cache_dir",
        f"Using cache directory: /root/.cache/vllm/torch_compile_cache/6f1e0c2a9b/rank_{rank.rank}_0/backbone "
        "for vLLM's torch.compile",
    )
    time.sleep(compile_s * 0.3)
    rank.once("dynamo", f"Dynamo bytecode transform time: {compile_s * 0.3:.2f} s")
    time.sleep(compile_s * 0.7)
    rank.once(
        "compile_range",
        f"Compiling a graph for compile range (1, {rank.config.max_num_batched_tokens}) takes {compile_s * 0.7:.2f} s",
    )
    rank.once("compile_total", rank.knobs.dialect.compile_total(compile_s))


def capture_graphs(rank: Rank) -> None:
    started = time.monotonic()
    seconds = phase_seconds(rank.knobs, "graphs")
    for label, count, share in (("mixed prefill-decode, PIECEWISE", 67, 0.6), ("decode, FULL", 35, 0.4)):
        desc = f"Capturing CUDA graphs ({label})"
        if rank.rank == 0:
            logfmt.progress(f"{desc}:   0%|          | 0/{count} [00:00<?, ?it/s]")
        time.sleep(seconds * share)
        if rank.rank == 0:
            rate = count / max(seconds * share, 1e-3)
            elapsed = logfmt.format_elapsed(seconds * share)
            logfmt.progress(f"{desc}: 100%|██████████| {count}/{count} [{elapsed}<00:00, {rate:.2f}it/s]")
    rank.once(
        "graphs_done",
        f"Graph capturing finished in {time.monotonic() - started:.0f} secs, took {sizing.CUDA_GRAPH_GIB:.2f} GiB",
    )


def _flashinfer(message: str) -> None:
    """flashinfer's own logger: ``2026-02-02 13:25:05,231 - INFO - file.py:N - flashinfer.jit: ...`` on stderr.
    (The file and line of its "Loading JIT ops" call were not checked against a flashinfer source.)"""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S") + f",{now.microsecond // 1000:03d}"
    logfmt.print_stderr(f"{stamp} - INFO - core.py:153 - flashinfer.jit: {message}")


JIT_KERNEL = "fused_moe_trtllm_sm120"


def jit_compile(rank: Rank, seconds: float) -> None:
    """A kernel compiled while serving: 0.24's Triton JIT monitor warns (each node's first rank), flashinfer
    logs the build; the step waits until it is done."""
    d = rank.knobs.dialect
    if d.watches_jit and rank.local_rank == 0:
        logfmt.warning(
            d.at("jit_compile"),
            "Triton kernel JIT compilation during inference: _fused_moe_kernel. This causes a latency spike; "
            "consider extending warmup to cover this shape/config.",
        )
    _flashinfer(f"Loading JIT ops: {JIT_KERNEL}")
    time.sleep(seconds)
    _flashinfer(f"Finished loading JIT ops: {JIT_KERNEL}")


def jit_monitor_activated(rank: Rank) -> None:
    """0.24 arms its Triton JIT monitor once warmup is done."""
    if rank.knobs.dialect.watches_jit:
        logfmt.info(
            rank.knobs.dialect.at("jit_monitor"),
            "Kernel JIT monitor activated — Triton JIT compilations during inference will be logged as warnings.",
        )
