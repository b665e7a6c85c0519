"""The fake GPU and model numbers the stand-in reports (a GB10: 121.69 GiB visible to CUDA)."""

from __future__ import annotations

import math

from sparkd_standin.args import ServeConfig
from sparkd_standin.dialect import Dialect

GIB = 1 << 30
TOTAL_GIB = 121.69  # what torch.cuda.mem_get_info reports as total on a GB10
MODEL_WEIGHTS_GIB = 60.25  # whole model; each rank holds its 1/world share
ACTIVATION_PEAK_GIB = 2.4  # profile-run peak besides weights
CUDA_GRAPH_GIB = 0.52
FREE_MEMORY_SHORTFALL_GIB = 8.22  # how far below the requested memory the refused start finds free memory
KV_BYTES_PER_TOKEN = 144 * 1024  # whole model, bf16 KV cache

_ARCHITECTURES = (
    ("deepseek", "DeepseekV3ForCausalLM"),
    ("qwen", "Qwen3ForCausalLM"),
    ("gpt-oss", "GptOssForCausalLM"),
    ("glm", "Glm4MoeForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("gemma", "Gemma3ForCausalLM"),
)


def architecture(model: str) -> str:
    lowered = model.lower()
    return next((arch for key, arch in _ARCHITECTURES if key in lowered), "LlamaForCausalLM")


def requested_gib(utilization: float) -> float:
    return round(math.ceil(TOTAL_GIB * GIB * utilization) / GIB, 2)


def free_memory_refusal(utilization: float, dialect: Dialect) -> str:
    """vLLM's startup refusal (``request_memory``), without the exception class."""
    wanted = requested_gib(utilization)
    free = round(max(0.01, wanted - FREE_MEMORY_SHORTFALL_GIB), 2)
    return dialect.free_memory(free, TOTAL_GIB, utilization, wanted)


def weights_gib(config: ServeConfig) -> float:
    return MODEL_WEIGHTS_GIB / config.world_size


def available_kv_gib(config: ServeConfig) -> float:
    """Per-rank KV cache memory; may be <= 0, which vLLM refuses."""
    if config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes / GIB
    return requested_gib(config.gpu_memory_utilization) - weights_gib(config) - ACTIVATION_PEAK_GIB


def kv_bytes_per_token(config: ServeConfig) -> float:
    per_token = KV_BYTES_PER_TOKEN / config.world_size
    return per_token / 2 if config.kv_cache_dtype.startswith("fp8") else per_token


def kv_cache_tokens(config: ServeConfig, kv_gib: float) -> int:
    tokens = int(kv_gib * GIB / kv_bytes_per_token(config))
    return max(0, tokens - tokens % config.block_size)


def max_concurrency(tokens: int, max_model_len: int) -> float:
    return tokens / max_model_len
