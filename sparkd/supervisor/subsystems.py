"""Where in vLLM (or under it) an exception was raised: the subsystem its innermost telling frame lies in, and the
module a frame's file is. Pure."""

from __future__ import annotations

__all__ = ["Subsystem", "module_of", "subsystem_of"]

import re
from collections.abc import Iterable
from enum import StrEnum

_SITE = re.compile(r"^.*?/(?:site-packages|dist-packages)/")


class Subsystem(StrEnum):
    """Where in vLLM (or under it) a frame lies: a failure while vLLM reads its arguments or builds its config is not
    the same as one while it loads the weights, brings up the device or the process group, or runs the engine."""

    args = "argument parsing"
    config = "configuration"
    device = "device initialisation"
    distributed = "distributed initialisation"
    loading = "model loading"
    kv_cache = "KV cache sizing"
    rpc = "the executor's RPC"
    collective = "a collective"
    step = "the engine's step"
    other = "elsewhere"


# Outermost first within a row; the innermost frame that matches a row names the subsystem (rows in order).
_SUBSYSTEMS: tuple[tuple[Subsystem, re.Pattern[str]], ...] = (
    (Subsystem.args, re.compile(r"/argparse\.py:|/vllm/(?:entrypoints/cli/|engine/arg_utils\.py:(?:parse|add_cli)|"
                                r"utils/argparse_utils\.py:)")),
    (Subsystem.config, re.compile(r"/vllm/(?:config/|engine/arg_utils\.py:|transformers_utils/config\.py:)|"
                                  r":(?:verify_\w+|create_engine_config|create_model_config|"
                                  r"create_speculative_config|_verify_\w+)$|"
                                  # a component's own config checking its values (LMCache's `_validate_config`)
                                  r"/config\.py:_?validate\w*$")),
    (Subsystem.kv_cache, re.compile(r":(?:determine_available_memory|_?check_enough_kv_cache_memory|"
                                    r"get_kv_cache_configs?|request_memory|_initialize_kv_caches|"
                                    r"initialize_kv_cache\w*)$")),
    (Subsystem.rpc, re.compile(r"/vllm/distributed/device_communicators/shm_broadcast\.py:|"
                               r":(?:collective_rpc|get_response|dequeue|acquire_read)$")),
    (Subsystem.collective, re.compile(r"/vllm/distributed/(?:device_communicators/|communication_op\.py:)|"
                                      r"/torch/distributed/distributed_c10d\.py:(?:all_reduce|all_gather\w*|broadcast\w*|"
                                      r"reduce_scatter\w*|all_to_all\w*|send|recv|isend|irecv|"
                                      r"batch_isend_irecv|reduce|gather|scatter)$|/(?:torch_npu|vllm_ascend)/\S*hccl|"
                                      # expert parallelism's all-to-all libraries (DeepEP, pplx, NVSHMEM's bindings)
                                      r"/(?:deep_ep|pplx_kernels|nvshmem)/|"
                                      r":(?:tensor_model_parallel_all_reduce|all_reduce|all_gather|reduce_scatter|"
                                      r"broadcast_tensor_dict)$")),
    (Subsystem.distributed, re.compile(r"/torch/distributed/(?:rendezvous|distributed_c10d)\.py:|"
                                       r":(?:init_distributed_environment|init_worker_distributed_environment|"
                                       r"initialize_model_parallel|init_process_group|ensure_model_parallel_"
                                       r"initialized)$")),
    (Subsystem.device, re.compile(r"/torch/cuda/__init__\.py:|:(?:init_device|_lazy_init|set_device)$")),
    (Subsystem.loading, re.compile(r"/vllm/model_executor/model_loader/|/safetensors/|/huggingface_hub/|"
                                   r":(?:load_model|load_weights|from_pretrained|hf_hub_download|snapshot_download)$")),
    # the engine's step: V1's busy loop and model runner, V0's engine loop (`run_engine_loop`, `engine_step`)
    (Subsystem.step, re.compile(r":(?:execute_model|sample_tokens|run_busy_loop|step|_process_engine_step|"
                                r"execute_dummy_batch|capture_model|_dummy_run|profile_run|"
                                r"engine_step|run_engine_loop|step_async|step_with_batch_queue)$")),
)


def subsystem_of(frames: Iterable[str]) -> Subsystem:
    """The subsystem of the first frame (``path:func``, innermost first) that lies in one."""
    for key in frames:
        for subsystem, pattern in _SUBSYSTEMS:
            if pattern.search(key):
                return subsystem
    return Subsystem.other


def module_of(path: str) -> str:
    """``/usr/lib/python3/dist-packages/torchvision/_meta_registrations.py`` → ``torchvision._meta_registrations``;
    outside site-packages, the file's folder and name (``/opt/x/torchvision/io.py`` → ``torchvision.io``)."""
    m = _SITE.match(path)
    if m is not None:
        rest = path[m.end():]
    elif "/vllm/" in path:  # a source checkout (`/opt/vllm-source/vllm/v1/engine/core.py`)
        rest = path[path.rindex("/vllm/") + 1:]
    else:
        rest = "/".join(path.split("/")[-2:])
    parts = rest.removesuffix(".py").split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(p for p in parts if p)
